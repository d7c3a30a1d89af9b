"""Calibrate ``algorithm="auto"`` for this machine, transport and world size, and cache it.

    ./mpirun.sh -n 2 python -m minidist.tune                  # MPI transport, 2 ranks
    python -m minidist.launch --standalone --nproc-per-node 2 -m minidist.tune   # TCP
    ./mpirun.sh -n 4 python -m minidist.tune --full           # sizes up to 32 MiB (slower)
    ./mpirun.sh -n 2 python -m minidist.tune --show           # what auto uses now; no timing
    python -m minidist.tune --show --world-size 4             # the same, without launching

A few seconds of timed all-reduces of every candidate algorithm (ring, tree, rd, MPI's own,
shared memory: what this transport offers) at sizes 8 B, 32 B, ... 2 MiB (``--full``: up to
32 MiB), then the same fit as the shipped table: size rules per buffer kind and
alpha-beta-gamma constants per algorithm (``minidist.auto.calibrate``). Past twice
the largest size measured, "auto" keeps the shipped table's choice: a calibration never
extrapolates what it did not time. Rank 0 writes the result to
``$MINIDIST_CACHE_DIR`` (default ``$XDG_CACHE_HOME/minidist`` or ``~/.cache/minidist``), one
file per host, transport and world size, stamped with the minidist version; from then on every
process group of that key uses it (``MINIDIST_DEBUG=1`` logs which table "auto" uses, once;
``MINIDIST_TUNE=0`` ignores the cache; ``MINIDIST_TUNE=1`` calibrates on first use when no file
matches). Without a calibration "auto" uses the shipped table
(``minidist/auto/auto_defaults.json``), measured on the development machine. Rank 0
prints what "auto" now picks at each size, beside the shipped table's pick.

``--show`` measures nothing: launched, it reports the job's own group; run as one process it
reports what a job of ``--world-size`` ranks (default: each world size cached for this host,
else 2) over ``--backend`` (default mpi) on this host would use, without starting one.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from minidist.comm import api as comm
from minidist.auto import calibrate, select
from minidist.comm.env import detect_launch
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
    p.add_argument("--world-size", type=int, default=None,
                   help="with --show in one process: the job size to report on")
    return p.parse_args(argv)


def report(group: comm.ProcessGroup) -> str:
    """The table rank 0 prints: size, auto's pick on ``group`` (its calibration, if any) and
    the shipped table's pick, for plain buffers and (where the group has them) buffers in a
    shared window."""
    return _report(group.auto_table(), group.transport.name, group.size)


def _report(now: dict, transport: str, world_size: int) -> str:
    shipped = select.table(world_size, now["has_native"], now["has_shm"])
    has_shm = now["has_shm"]
    lines = [f"# auto on {transport}, n={world_size}: {now['source']}",
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


def show_here(world_size: int | None, transport: str | None) -> str:
    """``--show`` in one process: what "auto" would use in a job of ``world_size`` ranks over
    ``transport`` on this host (each cached world size when None, else 2), and from where. The
    MPI transport on one host is taken to have shared memory, as ``./mpirun.sh`` gives."""
    transport = transport or "mpi"
    folder = calibrate.cache_dir()
    host = calibrate.cache_path(transport, 2).name.rsplit(f"-{transport}-n2.json", 1)[0]
    cached = sorted(int(f.stem.rsplit("-n", 1)[1]) for f in folder.glob(
        f"{host}-{transport}-n*.json") if f.stem.rsplit("-n", 1)[1].isdigit())
    lines = [f"# cache folder: {folder} (MINIDIST_CACHE_DIR moves it); shipped table: "
             f"{select.DEFAULTS_FILE} (measured on the development machine)"]
    for n in [world_size] if world_size else cached or [2]:
        off = calibrate.tune_mode() == "off"
        cal = None if off else calibrate.load(transport, n)
        native = shm = transport == "mpi"
        lines.append(_report(select.table(n, native, shm, calibration=cal), transport, n)
                     + ("\n# MINIDIST_TUNE=0: the cache is ignored" if off else ""))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.show and (detect_launch().world_size or 1) <= 1:  # one process: start no group
        print(show_here(args.world_size, args.backend))
        return 0
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
            from minidist.fastpath.shm import shm_close
            shm_close(group.transport)  # collective: windows go before MPI does
        comm.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
