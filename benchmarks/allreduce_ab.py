"""Small all-reduce latency, this checkout against an older commit, alternated in one window.

    .venv/bin/python benchmarks/allreduce_ab.py --old HEAD~10            # 4 rounds, n=2
    .venv/bin/python benchmarks/allreduce_ab.py --old v1.0 --rounds 6 --sizes 8,1K,1M

Did a change make ``all_reduce`` slower, or bring it nearer MPI's own? Each job times, per size,
``minidist.all_reduce(x)`` with the defaults (``auto``, ledger on: the user's call, through
every layer it passes) beside ``mpi_raw``, mpi4py's ``comm.Allreduce`` on the same communicator (no minidist at all),
interleaved call by call as ``allreduce.py`` does: a barrier, one call, its time at the slowest
rank. The old and the new code run one after the other, ``--rounds`` times each, the order
flipping every round::

    round 1:  old job, new job        each job: every size, auto and mpi_raw taking turns
    round 2:  new job, old job        result:   per size and side, the median over the rounds
    ...                                         of the job's median auto / median mpi_raw

The old code is ``git archive <rev> minidist`` unpacked into a temporary folder (as
``ddp_overhead_ab.py`` does); a job uses only the public API, so any commit runs it.

Output: a table on stdout, ``allreduce_ab.json`` and ``.txt`` in ``--out`` (default runs/bench/,
git-ignored).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (LOCAL_RESULTS, ab_entry, alternate, human, parse_bytes,  # noqa: E402
                     run_ab_job, write_ab)


def job(sizes: list[int], iters: int, warmup: int) -> dict[str, Any] | None:
    """One side's measurement (every rank runs it; rank 0 returns the result)."""
    import numpy as np

    import minidist as md
    from minidist import comm

    comm.init_process_group()
    group = comm.get_default_group()
    mpi, MPI = group.transport.comm, group.transport.MPI
    rows = []
    for nbytes in sizes:
        x = np.ones(max(1, nbytes // 4), np.float32)
        runs = (lambda x=x: md.all_reduce(x),
                lambda x=x: mpi.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM))
        times = np.zeros((2, iters))
        for i in range(warmup + iters):
            for k in ((0, 1) if i % 2 == 0 else (1, 0)):  # the order flips every iteration
                x[...] = 1.0
                mpi.Barrier()
                t0 = time.perf_counter()
                runs[k]()
                if i >= warmup:
                    times[k, i - warmup] = time.perf_counter() - t0
        mpi.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)  # each call at its slowest rank
        auto, raw = (float(np.median(t)) * 1e6 for t in times)
        rows.append({"nbytes": x.nbytes, "auto_us": auto, "raw_us": raw, "ratio": auto / raw,
                     "algorithm": group.plan_all_reduce(x).algorithm})
    rank = group.rank
    comm.destroy_process_group()
    return {"rows": rows} if rank == 0 else None


def run_side(args: argparse.Namespace, library: Path | None, out: Path) -> dict[str, Any]:
    return run_ab_job("allreduce_ab", __file__, args.n, [
        "--sizes", args.sizes, "--iters", str(args.iters), "--warmup", str(args.warmup)],
        library, out, args.timeout)


def table(rounds: list[dict[str, Any]], old: str, n: int) -> str:
    lines = [f"# md.all_reduce (auto, ledger on) / mpi4py Allreduce at n={n}, {len(rounds)} rounds "
             f"per side: old = {old[:10]}, new = this checkout",
             "#     size  old auto us  old raw us  old ratio  new auto us  new raw us  new ratio"
             "  new algorithm"]
    for i, row in enumerate(rounds[0]["new"]["rows"]):
        med = {(side, key): statistics.median(r[side]["rows"][i][key] for r in rounds)
               for side in ("old", "new") for key in ("auto_us", "raw_us", "ratio")}
        lines.append(f"  {human(row['nbytes']):>7}  {med['old', 'auto_us']:11.2f}  "
                     f"{med['old', 'raw_us']:10.2f}  {med['old', 'ratio']:8.2f}x  "
                     f"{med['new', 'auto_us']:11.2f}  {med['new', 'raw_us']:10.2f}  "
                     f"{med['new', 'ratio']:8.2f}x  {row['algorithm']}")
    return "\n".join(lines)


def driver(args: argparse.Namespace) -> None:
    old, rounds = alternate("allreduce_ab", args.old, args.rounds, Path(args.out),
                            lambda library, out: run_side(args, library, out))
    write_ab("allreduce_ab", Path(args.out), old, rounds, table(rounds, old, args.n))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--old", help="the commit to compare with (id, tag, branch); required")
    p.add_argument("--rounds", type=int, default=4, help="jobs per side, alternated")
    p.add_argument("--sizes", default="8,1K,1M", help="message sizes (default 8,1K,1M)")
    p.add_argument("--iters", type=int, default=300, help="timed calls per size and row")
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("-n", type=int, default=2, help="ranks per job")
    p.add_argument("--timeout", type=float, default=300, help="seconds per job")
    p.add_argument("--out", default=str(LOCAL_RESULTS), help="folder for the JSON/text results")
    p.add_argument("--job-out", help=argparse.SUPPRESS)
    p.add_argument("--library", help=argparse.SUPPRESS)
    args = p.parse_args()
    try:
        sizes = [parse_bytes(s) for s in args.sizes.split(",")]
    except ValueError as e:
        p.error(f"--sizes: {e}")
    ab_entry(p, args, lambda: job(sizes, args.iters, args.warmup), driver)


if __name__ == "__main__":
    main()
