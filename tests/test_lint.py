"""`ruff check minidist` passes with the rules in pyproject.toml ([tool.ruff.lint])."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from procs import REPO


def ruff_command():
    here = Path(sys.executable).parent / "ruff"  # the venv's, installed by the [test] extra
    if here.exists():
        return [str(here)]
    if shutil.which("ruff"):
        return ["ruff"]
    pytest.fail("ruff is not installed: pip install -e '.[test]' (the [test] extra brings it)")


def test_ruff_check_minidist_passes():
    result = subprocess.run([*ruff_command(), "check", "minidist"], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


# A measured time or speed-up in the library's comments and docstrings is one machine's number
# on one day: it goes stale and cannot be checked. Those belong in a benchmark's table, with the
# command that printed it (benchmarks/, docs/); the code says why, in words.
TIMING = re.compile(r"~ ?\d[\d.]* ?(us|µs|ms|ns)\b"             # ~55 us
                    r"|\d[\d.]*-\d[\d.]* ?(us|µs|ms|ns)\b"      # 8-13 ms
                    r"|\d[\d.]* ?(us|µs|ms) ?-> ?\d"             # 963 us -> 377 us
                    r"|~?\d[\d.]* ?x (faster|slower)\b|~?\d[\d.]*x (faster|slower)\b")  # 2x faster


def test_library_comments_carry_no_measured_timings():
    hits = [f"{p.relative_to(REPO)}:{i}: {line.strip()}"
            for p in sorted((REPO / "minidist").rglob("*.py"))
            for i, line in enumerate(p.read_text().splitlines(), 1) if TIMING.search(line)]
    assert not hits, ("timings in library comments (move them to a benchmark table, say why in "
                      "words):\n" + "\n".join(hits))
