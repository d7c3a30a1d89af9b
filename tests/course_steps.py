"""Run every course step (examples/course/0*.py) with --quick in ONE job: one mpiexec, not six.

    mpiexec -n 3 python tests/course_steps.py       # exit 0 when every step's check passed

Each step is run as its own __main__ (runpy), as a student would run it; the steps create and
destroy the process group themselves. Prints one "step <file>: exit <code>" line per step.
"""

import runpy
import sys
from pathlib import Path

COURSE = Path(__file__).resolve().parent.parent / "examples" / "course"


def main():
    failed = []
    for path in sorted(COURSE.glob("0*.py")):
        sys.argv = [str(path), "--quick"]
        try:
            runpy.run_path(str(path), run_name="__main__")
            code = 0
        except SystemExit as e:
            code = e.code or 0
        print(f"step {path.name}: exit {code}", flush=True)
        if code:
            failed.append(path.name)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
