"""Calibrate ``algorithm="auto"`` for this machine, transport and world size, and cache it.

    ./mpirun.sh -n 2 python -m minidist.tune                  # MPI transport, 2 ranks
    python -m minidist.launch --standalone --nproc-per-node 2 -m minidist.tune   # TCP
    ./mpirun.sh -n 4 python -m minidist.tune --full           # sizes up to 32 MiB (slower)
    ./mpirun.sh -n 2 python -m minidist.tune --show           # what auto uses now; no timing

A few seconds of timed all-reduces of every candidate algorithm (ring, tree, rd, MPI's own,
shared memory: what this transport offers) at sizes 8 B, 32 B, ... 2 MiB (``--full``: up to
32 MiB), then the same fit as the shipped table: size rules per buffer kind and
alpha-beta-gamma constants per algorithm (``minidist.comm.algorithms.calibrate``). Past twice
the largest size measured, "auto" keeps the shipped table's choice: a calibration never
extrapolates what it did not time. Rank 0 writes the result to
``$MINIDIST_CACHE_DIR`` (default ``~/.cache/minidist``), one file per host, transport and
world size; from then on every process group of that key uses it (``MINIDIST_DEBUG=1`` logs
which table "auto" uses; ``MINIDIST_TUNE=0`` ignores the cache; ``MINIDIST_TUNE=1`` calibrates
on first use when no file matches). Rank 0 prints what "auto" now picks at each size, beside
the shipped table's pick.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from minidist.comm import api as comm
from minidist.comm.algorithms import calibrate, select
from minidist.logger import get_logger

log = get_logger(__name__)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m minidist.tune", description=__doc__.split("\n")[0])
    p.add_argument("--full", action="store_true",
                   help="sizes up to 32 MiB (default: up to 2 MiB), more calls per size")
    p.add_argument("--max-bytes", type=int, default=None,
                   help="measure sizes 8 B, 32 B, ... up to this many bytes")
    p.add_argument("--backend", default=None, help="mpi or tcp (default: from the launcher)")
    p.add_argument("--show", action="store_true",
                   help="print what auto uses now (cache file or shipped table); measure nothing")
    p.add_argument("--dry-run", action="store_true", help="measure and print; write no file")
    return p.parse_args(argv)


def report(group: comm.ProcessGroup) -> str:
    """The table rank 0 prints: size, auto's pick on ``group`` (its calibration, if any) and
    the shipped table's pick, for plain buffers and (where the group has them) buffers in a
    shared window."""
    now = group.auto_table()
    shipped = select.table(group.size, now["has_native"], now["has_shm"])
    has_shm = now["has_shm"]
    lines = [f"# auto on {group.transport.name}, n={group.size}: {now['source']}",
             f"# {'size':>8s} {'plain: auto':>12s} {'shipped':>8s}"
             + (f" {'shared: auto':>13s} {'shipped':>8s}" if has_shm else "")]
    for a, b in zip(now["sizes"], shipped["sizes"]):
        if a["nbytes"].bit_length() % 2 == 0 or a["nbytes"] > 64 << 20:
            continue  # 8 B, 32 B, 128 B, ...: every fourth power of two
        cells = f"{a['plain']['algorithm']:>12s} {b['plain']['algorithm']:>8s}"
        if has_shm:
            cells += f" {a['shared']['algorithm']:>13s} {b['shared']['algorithm']:>8s}"
        lines.append(f"  {select.human_bytes(a['nbytes']):>8s} {cells}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.show:
        os.environ["MINIDIST_TUNE"] = "0"  # measure afresh: no cached table, no nested tune
    group = comm.init_process_group(backend=args.backend)
    try:
        if group.size < 2:
            if group.rank == 0:
                print("# one rank: nothing to calibrate (every all_reduce is a no-op). Run "
                      "under ./mpirun.sh -n N or python -m minidist.launch --nproc-per-node N.")
            return 0
        if not args.show:
            before = group.auto_table()["source"]
            cal = calibrate.calibrate(group, quick=not args.full, max_bytes=args.max_bytes,
                                      write=not args.dry_run)
            group.use_calibration(cal)
        if group.rank == 0:
            print(report(group))
            if not args.show:
                top = select.human_bytes(cal.measured_bytes or 0)
                print(f"# measured up to {top}; larger messages keep the shipped table's "
                      "choice (no extrapolation)")
                if args.dry_run:
                    print(f"# --dry-run: nothing written; auto still uses the {before}",
                          flush=True)
                else:
                    print(f"# wrote {calibrate.cache_path(group.transport.name, group.size)}; "
                          "MINIDIST_TUNE=0 ignores it, delete it to go back to the shipped "
                          "table", flush=True)
    finally:
        if group.backend == "mpi":
            from minidist.comm.algorithms.shm import shm_close
            shm_close(group.transport)  # collective: windows go before MPI does
        comm.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
