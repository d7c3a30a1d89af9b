"""What deterministic mode costs: the main job with and without ``--deterministic``, alternated.

    .venv/bin/python benchmarks/deterministic.py                 # 3 rounds, 4 ranks, 50 epochs
    .venv/bin/python benchmarks/deterministic.py --rounds 5 --epochs 20 -n 2

Each round runs ``mpiexec -n N python examples/train.py`` once plain and once with
``--deterministic``, the order flipping every round (a shared machine's load drifts; alternating
puts both modes under the same drift). A run's time is the ``elapsed`` that the job prints
(training and evaluation, not the interpreter's start). The ratio is the median deterministic
time over the median plain time. A first round warms Numba's on-disk cache of the fixed-order
kernels and is not counted.

Output: a table on stdout, ``deterministic.json`` in ``--out`` (default runs/bench/, git-ignored).
"""

from __future__ import annotations

import re
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (LOCAL_RESULTS, REPO, Parser, Table, machine_info,  # noqa: E402
                     mpiexec_path, one_thread_env, shown, usage_error, write_json)

TRAIN = REPO / "examples" / "train.py"


def run_job(n: int, epochs: int, deterministic: bool, timeout_s: float) -> tuple[float, str]:
    """One main job; returns (its printed elapsed seconds, its final line)."""
    argv = [mpiexec_path(), "-n", str(n), sys.executable, str(TRAIN), "--epochs", str(epochs)]
    if deterministic:
        argv.append("--deterministic")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                          env=one_thread_env(), cwd=REPO)
    found = re.search(r"^(final test_acc \S+)\s+elapsed ([\d.]+)s", done.stdout, re.M)
    if done.returncode != 0 or not found:
        raise SystemExit(f"deterministic.py: the job {' '.join(argv[3:])} failed "
                         f"(exit {done.returncode}):\n{done.stderr[-2000:]}")
    return float(found.group(2)), found.group(1)


def main() -> None:
    p = Parser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", type=int, default=4, help="ranks per job (default: 4)")
    p.add_argument("--epochs", type=int, default=50, help="epochs per job (default: 50)")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds (default: 3)")
    p.add_argument("--timeout", type=float, default=600, help="seconds per job (default: 600)")
    p.add_argument("--out", type=Path, default=LOCAL_RESULTS, help="folder for the JSON")
    args = p.parse_args()
    if args.n < 1 or args.epochs < 1 or args.rounds < 1:
        usage_error("-n, --epochs and --rounds take a positive number")

    run_job(args.n, 1, True, args.timeout)  # compiles (or loads) the fixed-order kernels
    times: dict[str, list[float]] = {"plain": [], "deterministic": []}
    finals: dict[str, set[str]] = {"plain": set(), "deterministic": set()}
    table = Table([("round", 5, "d"), ("plain (s)", 10, ".2f"), ("determ. (s)", 11, ".2f")])
    print(f"# main job, {args.n} ranks, {args.epochs} epochs; elapsed as the job prints it")
    print(table.header())
    for r in range(args.rounds):
        order = ["plain", "deterministic"][::1 if r % 2 == 0 else -1]
        row = {}
        for mode in order:
            row[mode], final = run_job(args.n, args.epochs, mode == "deterministic", args.timeout)
            times[mode].append(row[mode])
            finals[mode].add(final)
        print(table.row(r + 1, row["plain"], row["deterministic"]), flush=True)
    med = {mode: statistics.median(ts) for mode, ts in times.items()}
    ratio = med["deterministic"] / med["plain"]
    print(f"median: plain {med['plain']:.2f} s, deterministic {med['deterministic']:.2f} s, "
          f"ratio {ratio:.2f}x")
    for mode, lines in finals.items():
        print(f"{mode}: {' | '.join(sorted(lines))}")
    path = write_json(args.out / "deterministic.json", machine_info({
        "ranks": args.n, "epochs": args.epochs, "rounds": args.rounds, "elapsed_s": times,
        "median_s": med, "ratio": ratio, "final_lines": {m: sorted(v) for m, v in finals.items()}}))
    print(f"wrote {shown(path)}")


if __name__ == "__main__":
    main()
