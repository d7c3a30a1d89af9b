"""All-reduce benchmark, nccl-tests / OSU style: every algorithm beside MPI's own Allreduce.

    ./mpirun.sh -n 2 python benchmarks/allreduce.py                      # 8 B .. 64 MiB, x2 steps
    ./mpirun.sh -n 4 python benchmarks/allreduce.py --quick              # x4 steps, fewer iters
    ./mpirun.sh -n 2 python benchmarks/allreduce.py --algorithms ring,mpi,shm --min-bytes 1M
    ./mpirun.sh -n 2 python benchmarks/allreduce.py --algorithms auto,ring --ledger-compare \
        --max-bytes 1M --name ledger_n2      # the ledger's cost: each X beside X-off
    python benchmarks/allreduce.py --fit benchmarks/results/allreduce_n2.json \\
        benchmarks/results/allreduce_n4.json          # alpha-beta constants for select.py

For each size and algorithm: first the result is checked against ``direct`` (the naive oracle;
#wrong counts elements that differ beyond float round-off, and the run also checks that every
rank holds identical bits), then ``iters`` timed calls, each after a barrier and after restoring
the input (untimed), so every call reduces the same data. A call's time is the slowest rank's.

    algbw = bytes / time        busbw = algbw * 2(n-1)/n   (what each rank's link carries in a
    ratio = median time / MPI median time at that size     bandwidth-optimal algorithm)

Algorithms: ``ring tree rd direct mpi auto`` (the registry), ``shm`` (shared-memory window,
plain NumPy buffer) and ``shm_zc`` (the same with the buffer allocated in the shared window by
``shm_alloc_buffer``, so the copy-in disappears); ``mpi_raw`` is mpi4py's ``comm.Allreduce``
called straight on the communicator (no minidist code: the floor for small messages). Rank 0
prints the table, the ring/tree crossover, and writes ``results/allreduce_n{N}.json`` (+ ``.png``
when matplotlib is there).

On a busy machine (benchmarks/README.md): each row keeps its quartiles and ``spread``
(interquartile range / median); the JSON keeps the load average at the start and the end, and a
note says when other processes loaded the cores before the run. The crossover is claimed only
when ring's and tree's interquartile ranges are apart at every size from it up, else printed as
uncertain. The time left (stderr) models a call as latency + a cost per byte, probed before the
sweep at ``PROBE_BYTES``. Ctrl-C: the ranks agree to stop after the current iteration, rank 0
writes the sizes finished (JSON and plot), prints one line, exit code 130. A flag that cannot
work is one line from rank 0, exit code 2, before any process group starts.

TCP backend beside torch's gloo, in one run (torchrun-style environment, e.g. the launcher)::

    python -m minidist.launch --standalone --nproc-per-node 2 benchmarks/allreduce.py \
        --backend tcp --algorithms rd,ring,auto --name allreduce_tcp_n2

``gloo`` (added with ``--backend tcp`` when torch is importable; ``--no-gloo`` leaves it out) is
``torch.distributed.all_reduce`` with the gloo backend on a ``torch.from_numpy`` view of the
same buffer, timed interleaved with the others, checked like them; rank 0 serves gloo's store
on a free port that the minidist group broadcasts. ``vs gloo`` = median / gloo's median.

Rows that cannot run in this job are skipped with a printed line saying why, and the sweep goes
on with the others: ``shm`` and the ``*_zc`` rows when the ranks span several nodes (shared
memory is one node's), ``mpi``/``mpi_raw``/``*_zc`` under ``--backend tcp``. Across real nodes
(e.g. ``python -m minidist.testing.cluster``, docs/launching.md) ``hier`` is the row to watch.

``X-off`` runs X with no observer of the call (no ledger entry: what
``MINIDIST_LEDGER=0`` does for a whole job); ``--ledger-compare`` adds ``X-off`` beside every
X and prints the on/off ratio of the medians per size (both measured interleaved, one run).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from _common import (LOCAL_RESULTS, Eta, Parser, StopRequest, Stopped, Table, busy_note,
                     human, load_average, machine_info, parse_bytes,
                     shown, sizes, stats, usage_error, write_json)

DEFAULT_ALGOS = "ring,tree,rd,direct,mpi,auto,shm,shm_zc,mpi_zc,auto_zc"
# What --algorithms takes (each also as X_zc and X-off; see known_algorithms): the CPU
# algorithms of the registry, auto, and MPI's Allreduce called directly. The GPU algorithms
# (cuda_ipc, host_copy, ipc_host) are benchmarks/gpu_allreduce.py's.
PUBLIC_ALGOS = ("ring", "tree", "rd", "direct", "mpi", "shm", "hier", "auto", "mpi_raw")
SHIPPED_TABLE = (Path(__file__).resolve().parent.parent
                 / "minidist/auto/auto_defaults.json")


@dataclass
class Args:
    min_bytes: int
    max_bytes: int
    step: int
    iters: int | None
    warmup: int
    algorithms: list[str]
    dtype: str
    op: str
    out: Path
    name: str | None
    backend: str
    plot: bool
    ledger_compare: bool = False
    burst: int = 1
    gloo: bool = False
    note: str = ""


def parse_args(argv: list[str] | None = None) -> Args | tuple:
    p = Parser(description=__doc__.split("\n")[0])
    p.add_argument("--min-bytes", default="8", help="smallest message (e.g. 8, 4K, 1M)")
    p.add_argument("--max-bytes", default="64M", help="largest message (default 64M)")
    p.add_argument("--step", type=int, default=None, help="size factor per step (2; 4 w/ quick)")
    p.add_argument("--iters", type=int, default=None,
                   help="timed calls per point (default: 200 for small, down to 10 at 64 MiB)")
    p.add_argument("--warmup", type=int, default=None, help="untimed calls first (default 3)")
    p.add_argument("--algorithms", default=DEFAULT_ALGOS, help=f"default {DEFAULT_ALGOS}")
    p.add_argument("--dtype", default="float32", help="element type (default float32)")
    p.add_argument("--op", default="sum", help="reduction: sum, avg, max, min, prod (default sum)")
    p.add_argument("--out", default=str(LOCAL_RESULTS), help="directory for JSON/PNG")
    p.add_argument("--name", default=None,
                   help="file stem (default allreduce_n{N} over MPI on one node, else "
                        "allreduce_{backend}_{nodes}x{ranks per node}, e.g. allreduce_tcp_2x2)")
    p.add_argument("--note", default="",
                   help="a few words for the plot's title and the JSON, e.g. '1 Gbit links'")
    p.add_argument("--backend", default="mpi", help="mpi (under mpiexec) or tcp (torchrun env)")
    p.add_argument("--quick", action="store_true", help="x4 steps, <= 20 iters, 1 warm-up")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--ledger-compare", action="store_true",
                   help="add X-off (no ledger entry) beside every algorithm X")
    p.add_argument("--burst", type=int, default=1,
                   help="calls per timed sample, back to back (no barrier or input restore "
                        "between them: warm caches, as in a training loop); time is per call")
    p.add_argument("--no-gloo", action="store_true",
                   help="with --backend tcp: leave out torch gloo (default: beside, if importable)")
    p.add_argument("--fit", nargs="+", metavar="JSON", help="fit select.py constants and exit")
    p.add_argument("--fit-out", default=str(LOCAL_RESULTS / "allreduce_fit.json"))
    p.add_argument("--markdown", nargs="+", metavar="JSON", help="print result tables and exit")
    p.add_argument("--emit-defaults", action="store_true",
                   help="with --fit: also write the shipped table of auto "
                        "(minidist/auto/auto_defaults.json)")
    a = p.parse_args(argv)
    if a.markdown:
        for path in a.markdown:
            print(markdown(json.loads(Path(path).read_text())) + "\n")
        raise SystemExit(0)
    if a.fit:
        return ("fit", a.fit, Path(a.fit_out), SHIPPED_TABLE if a.emit_defaults else None)
    step = a.step or (4 if a.quick else 2)
    iters = a.iters if a.iters is not None else (20 if a.quick else None)
    warmup = a.warmup if a.warmup is not None else (1 if a.quick else 3)
    algos = [x.strip() for x in a.algorithms.split(",") if x.strip()]
    if a.ledger_compare:
        algos += [x + "-off" for x in algos if not x.endswith("-off") and x != RAW_MPI]
    for flag, value, least in (("--step", step, 2), ("--burst", a.burst, 1),
                               ("--iters", iters, 1), ("--warmup", warmup, 0)):
        if value is not None and value < least:
            usage_error(f"{flag} must be >= {least}, got {value}")
    unknown = [x for x in algos if x not in known_algorithms()]
    if unknown or not algos:
        what = "unknown " + ", ".join(map(repr, unknown)) if unknown else "empty"
        usage_error(f"--algorithms: {what}; choose from {', '.join(PUBLIC_ALGOS)} (X_zc: X on "
                    "a buffer in the shared-memory window; X-off: X with no ledger entry)")
    if a.backend not in ("mpi", "tcp"):
        usage_error(f"--backend {a.backend}: use mpi (under mpiexec) or tcp (torchrun-style env)")
    if a.op not in OPS:
        usage_error(f"--op {a.op}: use one of {', '.join(OPS)}")
    try:
        dtype = np.dtype(a.dtype)
    except TypeError:
        usage_error(f"--dtype {a.dtype}: not a NumPy type; use e.g. float32, float64, int32")
    try:
        lo, hi = parse_bytes(a.min_bytes), parse_bytes(a.max_bytes)
    except ValueError as e:
        usage_error(str(e))
    size_range(lo, hi, dtype)
    return Args(lo, hi, step, iters, warmup, algos, dtype.name, a.op, Path(a.out), a.name,
                a.backend, not a.no_plot, a.ledger_compare, a.burst,
                a.backend == "tcp" and not a.no_gloo, a.note)


OPS = ("sum", "avg", "max", "min", "prod")


def size_range(lo: int, hi: int, dtype: np.dtype) -> None:
    """Refuse (one line) a size range with nothing to measure or a size that is not a whole
    number of elements (the row would be labelled with bytes it does not move)."""
    item = dtype.itemsize
    if lo > hi:
        usage_error(f"--min-bytes {human(lo)} is above --max-bytes {human(hi)}: nothing to "
                    "measure; give a --min-bytes <= --max-bytes")
    if hi < item:
        usage_error(f"--max-bytes {human(hi)} holds no {dtype.name} element ({item} bytes "
                    f"each); use --max-bytes {item} or more")
    if lo % item:
        near = " or ".join(str(x) for x in dict.fromkeys((lo // item * item or item,
                                                         (lo // item + 1) * item)))
        usage_error(f"--min-bytes {lo} is not a whole number of {dtype.name} elements ({item} "
                    f"bytes each), so its rows would move fewer bytes than they are labelled "
                    f"with; use {near}")


# ---------------------------------------------------------------- running one point

def default_iters(nbytes: int) -> int:
    return max(10, min(200, (256 << 20) // max(nbytes, 1)))


RAW_MPI = "mpi_raw"  # MPI's own Allreduce called directly (mpi4py), the floor of every path


def base_algorithm(name: str) -> str:
    """``auto_zc-off`` -> ``auto``: the registered algorithm a row name runs."""
    return name.removesuffix("-off").removesuffix("_zc")


def make_runner(group: Any, name: str) -> Callable:
    """run(buf, op) for an algorithm name; ``X_zc`` runs X (``shm_zc``: shm) on a shared buffer,
    ``X-off`` runs X unobserved (no ledger entry, as with MINIDIST_LEDGER=0)."""
    if name == RAW_MPI:  # mpi4py's Allreduce straight on the communicator: no minidist at all
        comm, mpi = group.transport.comm, group.transport.MPI
        ops = {"sum": mpi.SUM, "max": mpi.MAX, "min": mpi.MIN, "prod": mpi.PROD}

        def run_raw(buf: Any, op: str) -> None:
            comm.Allreduce(mpi.IN_PLACE, buf, op=ops[op])
        return run_raw
    algo = base_algorithm(name)
    if name.endswith("-off"):
        def run_off(buf: Any, op: str) -> None:
            with group.calls.unobserved():  # every rank alike: same interleaving everywhere
                group.all_reduce(buf, op=op, algorithm=algo)
        return run_off

    def run(buf: Any, op: str) -> None:
        group.all_reduce(buf, op=op, algorithm=algo)
    return run


def start_gloo(group: Any) -> Callable | None:
    """torch.distributed with gloo beside ``group``: a runner ``run(buf, op)``, or None (and one
    printed line) when torch is not installed."""
    try:
        import torch
        import torch.distributed as td
    except ImportError:
        if group.rank == 0:
            print("# torch is not installed: no gloo column (pip install torch to compare)")
        return None
    import datetime

    host = os.environ.get("MASTER_ADDR", "127.0.0.1")
    wait = datetime.timedelta(seconds=60)
    port = np.zeros(1, np.int64)
    store = None
    if group.rank == 0:  # port 0: the kernel picks a free one, nothing to guess or collide
        store = td.TCPStore(host, 0, group.size, True, timeout=wait, wait_for_workers=False)
        port[0] = store.port
    group.broadcast(port, src=0)
    if store is None:
        store = td.TCPStore(host, int(port[0]), group.size, False, timeout=wait)
    td.init_process_group("gloo", store=store, rank=group.rank, world_size=group.size)
    ops = {"sum": td.ReduceOp.SUM, "max": td.ReduceOp.MAX, "min": td.ReduceOp.MIN,
           "prod": td.ReduceOp.PRODUCT}

    def run(buf: Any, op: str) -> None:
        if op not in ops:
            raise SystemExit(f"gloo has no op {op!r}; use --op sum/max/min/prod or --no-gloo")
        td.all_reduce(torch.from_numpy(buf), op=ops[op])
    return run


def barrier_fn(group: Any) -> Callable[[], None]:
    comm = getattr(group.transport, "comm", None)
    return comm.Barrier if comm is not None and hasattr(comm, "Barrier") else group.barrier


def count_wrong(buf: np.ndarray, ref: np.ndarray, n: int) -> int:
    """Elements differing from the oracle beyond round-off (other summation orders)."""
    if buf.dtype.kind in "iu":
        return int(np.count_nonzero(buf != ref))
    tol = 1e-2 if buf.dtype == np.float16 else 1e-5
    return int(np.count_nonzero(~np.isclose(buf, ref, rtol=tol, atol=tol * n)))


def identical_everywhere(group: Any, buf: np.ndarray) -> bool:
    import zlib

    digest = np.array([zlib.crc32(buf.tobytes())], np.int64)
    return bool((group.all_gather(digest) == digest[0]).all())


def time_interleaved(group: Any, runs: list[tuple[Callable, np.ndarray]], base: np.ndarray,
                     op: str, iters: int, warmup: int, burst: int = 1,
                     stop: Callable[[], bool] | None = None) -> list[list[float]]:
    """Per-call seconds (slowest rank) of every ``(run, buf)``, ``iters`` calls each, INTERLEAVED:
    iteration i runs every algorithm once, in a random order (seeded by i: the same on every
    rank), each after restoring its input and a barrier. Load from other jobs then hits all
    algorithms alike, so the ratios between them (auto vs the best, X vs MPI) hold even when
    absolute times drift by 30 %; the shuffle keeps one algorithm from always running after the
    same other one (a warm cache left by the predecessor made e.g. shm look 15 % faster than
    auto running the very same shm code). ``burst`` > 1: each sample is that many calls back to
    back (the buffer keeps accumulating), divided by ``burst``.

    ``stop`` (a collective, ``StopRequest.agreed``) is asked after the warm-up and about ten
    times per size, between iterations; when it says so, ``Stopped`` leaves the size on every
    rank at the same iteration."""
    barrier = barrier_fn(group)
    k = len(runs)
    local = np.empty((k, iters))
    for _ in range(warmup):
        for run, buf in runs:
            buf[...] = base
            run(buf, op)
    every = max(1, iters // 10)
    for i in range(iters):
        if stop is not None and i % every == 0 and stop():
            raise Stopped
        for j in np.random.default_rng(i).permutation(k):
            run, buf = runs[j]
            buf[...] = base
            barrier()
            t0 = time.perf_counter()
            for _ in range(burst):
                run(buf, op)
            local[j, i] = (time.perf_counter() - t0) / burst
    return group.all_gather(local.reshape(-1)).max(axis=0).reshape(k, iters).tolist()


PROBE_BYTES = 64 << 20  # the time-left estimate's per-byte cost is measured up to this size


def probe_seconds_per_byte(group: Any, runs: list[tuple[Callable, Any]], full: np.ndarray,
                           op: str, nbytes: int) -> float:
    """Seconds per byte of one call at ``nbytes``, as the sweep times it (restore the input,
    barrier, call), averaged over the algorithms, under the machine's present load: what the
    large sizes, which take most of the sweep's time, will cost, known before the sweep
    reaches them (for ``Eta``). Each algorithm first runs once on a few elements (a first call
    may set things up) and on buffers already touched (no page faults in the timed call)."""
    barrier = barrier_fn(group)
    count = nbytes // full.dtype.itemsize
    spent = 0.0
    for run, buf in runs:
        buf[:count] = full[:count]
        run(buf[:min(count, 256)], op)
    for run, buf in runs:
        t0 = time.perf_counter()
        buf[:count] = full[:count]
        barrier()
        run(buf[:count], op)
        spent += time.perf_counter() - t0
    return spent / len(runs) / max(nbytes, 1)


OURS = ("ring", "tree", "rd", "direct", "shm", "hier")  # "our own algorithms": auto's targets


def best_of_ours(point: list[dict], zc: bool) -> dict | None:
    """The fastest of ring/tree/rd/direct/shm/hier (those in the run) at one size, on plain
    (or shared: zc) buffers."""
    mine = [r for r in point if r["algorithm"] in
            ([a + "_zc" for a in OURS] if zc else OURS)]
    return min(mine, key=lambda r: r["median_us"]) if mine else None


# ---------------------------------------------------------------- the sweep

def unavailable(group: Any, name: str) -> str | None:
    """Why row ``name`` cannot run in ``group`` (None: it can). Decided from the backend and the
    topology, which every rank sees alike, so every rank skips the same rows."""
    base = name.removesuffix("-off")
    if group.backend != "mpi" and (base in (RAW_MPI, "mpi") or base.endswith("_zc")):
        what = ("a buffer in MPI's shared-memory window" if base.endswith("_zc")
                else "the MPI transport")
        return f"needs {what} (this run's backend: {group.backend})"
    nodes = group.topology.num_nodes
    if nodes > 1 and (base_algorithm(name) == "shm" or base.endswith("_zc")):
        what = "shared memory" if base_algorithm(name) == "shm" else "its shared-memory buffer"
        return (f"{what} works within one node, and these {group.size} ranks span {nodes} "
                "nodes (hier is the multi-node algorithm)")
    return None


def sweep(args: Args, group: Any, gloo: Callable | None = None,
          stop: Callable[[], bool] | None = None) -> dict:
    """Measure every size; ``stop`` (collective) ends it early, keeping the sizes done
    (``out["interrupted"]`` then says how many of how many)."""
    n, rank = group.size, group.rank
    skipped = {a: why for a in args.algorithms if (why := unavailable(group, a)) is not None}
    if rank == 0:
        for a, why in skipped.items():
            print(f"# skipped {a}: {why}", flush=True)
    args.algorithms = [a for a in args.algorithms if a not in skipped]
    if not args.algorithms:
        raise SystemExit(f"no algorithm of --algorithms can run here (skipped: "
                         f"{', '.join(skipped)}); add ring,rd,hier,auto")
    dtype = np.dtype(args.dtype)
    points = [s for s in sizes(max(args.min_bytes, dtype.itemsize), args.max_bytes, args.step)]
    max_count = max(points) // dtype.itemsize
    runners = {a: make_runner(group, a) for a in ["direct", *args.algorithms] if a != "gloo"}
    if "gloo" in args.algorithms:
        runners["gloo"] = gloo
    shared = None
    if any(a.removesuffix("-off").endswith("_zc") for a in args.algorithms):
        from minidist.fastpath.shm import shm_alloc_buffer
        shared = shm_alloc_buffer(group.transport, max_count, dtype)
    rng = np.random.default_rng(1234 + rank)
    full = (rng.integers(-100, 100, max_count) if dtype.kind in "iu"
            else rng.standard_normal(max_count)).astype(dtype)
    # the ratio columns of the rows this run has: (title, row key, what it is)
    ratios = [(title, key, what) for title, key, what, row in (
        ("vs mpi", "ratio_to_mpi", "/ mpi (MPI's Allreduce through minidist)", "mpi"),
        ("vs raw", "ratio_to_mpi_raw", f"/ {RAW_MPI} (mpi4py's comm.Allreduce called directly)",
         RAW_MPI),
        ("vs gloo", "ratio_to_gloo", "/ torch's gloo", "gloo"),
        ("vs best", "ratio_to_best_ours", f"auto / the fastest of {'/'.join(OURS)} in this run "
         "(same buffer kind) at that size", "auto")) if any(
            base_algorithm(a) == row for a in args.algorithms)]
    table = Table([("size(B)", 10, "d"), ("count", 9, "d"), ("algorithm", 9, "s"),
                   ("median(us)", 11, ".1f"), ("min(us)", 10, ".1f"), ("max(us)", 10, ".1f"),
                   ("spread", 6, ".2f"), ("algbw(GB/s)", 11, ".3f"), ("busbw(GB/s)", 11, ".3f"),
                   *[(title, 7, ".2f") for title, _, _ in ratios], ("#wrong", 6, "d")])
    if rank == 0:
        print(f"# minidist all_reduce benchmark: n={n}, dtype={dtype.name}, op={args.op}, "
              f"backend={group.backend}; timings interleaved; 'spread' = interquartile range / "
              "median; " + "; ".join(f"'{title}' = {what}" for title, _, what in ratios),
              flush=True)
        print(table.header(), flush=True)
    rows = []
    plain = np.empty(max_count, dtype)
    # progress on stderr (the table stays clean): time left from a per-call model of the sizes
    # done (Eta); calls per size: warm-up and timed calls, the check, the oracle
    calls = [((args.warmup + (args.iters or default_iters(nb))) * args.burst + 1)
             * len(args.algorithms) + 1 for nb in points]
    probe = min(max(points), PROBE_BYTES) // dtype.itemsize * dtype.itemsize
    per_byte = probe_seconds_per_byte(group, [(runners[a], shared if a.removesuffix(
        "-off").endswith("_zc") else plain) for a in args.algorithms], full, args.op, probe)
    eta = Eta(per_byte, probe) if rank == 0 else None
    progress: list[dict] = []
    t_start, sizes_done = time.perf_counter(), 0
    try:
        for i, nbytes in enumerate(points):
            if stop is not None and stop():
                raise Stopped
            t_size = time.perf_counter()
            count = nbytes // dtype.itemsize
            base = full[:count]
            ref = base.copy()
            runners["direct"](ref, args.op)
            iters = args.iters or default_iters(nbytes)
            point, runs = [], []
            for name in args.algorithms:
                run = runners[name]
                buf = shared[:count] if name.removesuffix("-off").endswith("_zc") else plain[:count]
                buf[...] = base
                run(buf, args.op)
                wrong = count_wrong(buf, ref, n)
                same = identical_everywhere(group, buf)
                wrong = int(group.all_gather(np.array([wrong])).max()) + (0 if same else 1)
                row = {"nbytes": nbytes, "count": count, "algorithm": name, "wrong": wrong,
                       "identical": same}
                if name != "gloo" and base_algorithm(name) == "auto":
                    row["chose"] = group.auto_choice(buf)[0]
                point.append(row)
                runs.append((run, buf))
            timed = time_interleaved(group, runs, base, args.op, iters, args.warmup, args.burst,
                                     stop)
            for row, samples in zip(point, timed):
                st = stats(samples)
                algbw = nbytes / st["median_us"] / 1e3
                row.update(st, algbw_GBps=algbw,
                           busbw_GBps=algbw * 2 * (n - 1) / n if n > 1 else 0.0)
            mpi = next((r for r in point if r["algorithm"] == "mpi"), None)
            raw = next((r for r in point if r["algorithm"] == RAW_MPI), None)
            gloo_row = next((r for r in point if r["algorithm"] == "gloo"), None)
            for r in point:
                r["ratio_to_mpi"] = r["median_us"] / mpi["median_us"] if mpi else None
                r["ratio_to_mpi_raw"] = r["median_us"] / raw["median_us"] if raw else None
                r["ratio_to_gloo"] = r["median_us"] / gloo_row["median_us"] if gloo_row else None
                best = (best_of_ours(point, r["algorithm"].removesuffix("-off").endswith("_zc"))
                        if base_algorithm(r["algorithm"]) == "auto" else None)
                r["ratio_to_best_ours"] = r["median_us"] / best["median_us"] if best else None
                r["best_ours"] = best["algorithm"] if best else None
                if rank == 0:
                    print(table.row(nbytes, count, r["algorithm"], r["median_us"], r["min_us"],
                                    r["max_us"], r["spread"], r["algbw_GBps"], r["busbw_GBps"],
                                    *[r[key] for _, key, _ in ratios], r["wrong"]),
                          flush=True)
            rows += point
            sizes_done = i + 1
            if eta is not None:
                eta.done(nbytes, calls[i], time.perf_counter() - t_size)
                if i + 1 < len(points):
                    spent = time.perf_counter() - t_start
                    left = eta.left(list(zip(points[i + 1:], calls[i + 1:])))
                    progress.append({"sizes_done": i + 1, "elapsed_s": spent, "left_s": left,
                                     "size_s": time.perf_counter() - t_size})
                    print(f"# progress: {i + 1}/{len(points)} sizes in {spent:.0f} s; about "
                          f"{left:.0f} s left at the present load", file=sys.stderr,
                          flush=True)
    except Stopped:
        pass
    out = {"n": n, "dtype": dtype.name, "op": args.op, "backend": group.backend, "note": args.note,
           "nodes": group.topology.num_nodes, "skipped": skipped, "burst": args.burst,
           "interrupted": ({"sizes_done": sizes_done, "sizes_planned": len(points)}
                           if sizes_done < len(points) else None),
           "progress": progress, "probe_s_per_byte": per_byte, "rows": rows,
           "crossover_ring_tree": crossover(rows, "ring", "tree"),
           "ring_vs_tree": crossover_claim(rows, "ring", "tree")}
    out["auto_vs_best"] = auto_vs_best(rows)
    summaries = rank == 0 and not out["interrupted"]  # Ctrl-C: one line, from main
    if summaries and out["auto_vs_best"]:
        print(auto_table(out["auto_vs_best"]), flush=True)
    if args.ledger_compare:
        out["ledger_overhead"] = ledger_overhead(rows)
        if summaries:
            print(ledger_table(out["ledger_overhead"]), flush=True)
    return out


AUTO_TOLERANCE = 0.05  # the goal: auto within 5 % of the best of our own algorithms


def auto_vs_best(rows: list[dict]) -> list[dict]:
    """Per size and auto row (``auto``, ``auto_zc``): auto / best of ours, and why it misses.

    ``picked_vs_best``: the row of the algorithm auto ran (same buffer kind) / the best. When
    auto misses the goal, that ratio tells the two causes apart: above the tolerance, the rule
    picked the wrong algorithm ("rule"); within it, auto and the algorithm it ran measured
    differently in one run ("noise": the same code, timed apart).
    """
    by = {(r["nbytes"], r["algorithm"]): r for r in rows}
    out = []
    for r in rows:
        if base_algorithm(r["algorithm"]) != "auto" or r.get("ratio_to_best_ours") is None \
                or r["algorithm"].endswith("-off"):
            continue
        zc = r["algorithm"].endswith("_zc")
        picked = by.get((r["nbytes"], r["chose"] + ("_zc" if zc else "")))
        best = by[(r["nbytes"], r["best_ours"])]
        pvb = picked["median_us"] / best["median_us"] if picked else None
        ratio = r["ratio_to_best_ours"]
        cause = ("ok" if ratio <= 1 + AUTO_TOLERANCE else
                 "rule" if pvb is None or pvb > 1 + AUTO_TOLERANCE else "noise")
        out.append({"nbytes": r["nbytes"], "row": r["algorithm"], "chose": r["chose"],
                    "best": r["best_ours"], "ratio": ratio, "picked_vs_best": pvb,
                    "cause": cause})
    return out


def auto_table(summary: list[dict]) -> str:
    """One line per auto row kind: within the tolerance at k of n sizes, then each miss."""
    lines = []
    for kind in dict.fromkeys(s["row"] for s in summary):
        pts = [s for s in summary if s["row"] == kind]
        ok = sum(s["cause"] == "ok" for s in pts)
        lines.append(f"# {kind} <= {1 + AUTO_TOLERANCE:.2f}x the best of ours at {ok} of "
                     f"{len(pts)} sizes (max {max(s['ratio'] for s in pts):.2f})")
        for s in pts:
            if s["cause"] != "ok":
                pvb = "-" if s["picked_vs_best"] is None else f"{s['picked_vs_best']:.2f}"
                lines.append(f"#   {human(s['nbytes']):>8s}: {s['ratio']:.2f} (ran {s['chose']}, "
                             f"best {s['best']}; {s['chose']}'s own row / best = {pvb}: "
                             f"{s['cause']})")
    return "\n".join(lines)


def ledger_overhead(rows: list[dict]) -> list[dict]:
    """Per size and algorithm X: median with the ledger on (X) and off (X-off), and on/off."""
    by = {(r["nbytes"], r["algorithm"]): r for r in rows}
    out = []
    for (nbytes, name), r in sorted(by.items()):
        off = by.get((nbytes, name + "-off"))
        if off is not None and not name.endswith("-off"):
            out.append({"nbytes": nbytes, "algorithm": name, "on_us": r["median_us"],
                        "off_us": off["median_us"], "ratio": r["median_us"] / off["median_us"]})
    return out


def ledger_table(overhead: list[dict]) -> str:
    """The on/off comparison as printed lines (one row per size, one column per algorithm)."""
    algos = list(dict.fromkeys(o["algorithm"] for o in overhead))
    lines = ["# ledger + fingerprints: median on / median off (same run, interleaved)",
             "# size(B)   " + "".join(f"{a + ' on/off (us)':>28s}" for a in algos)]
    for nbytes in sorted({o["nbytes"] for o in overhead}):
        cells = []
        for a in algos:
            o = next((x for x in overhead if x["nbytes"] == nbytes and x["algorithm"] == a), None)
            cells.append(f"{o['on_us']:9.1f} / {o['off_us']:9.1f} = {o['ratio']:5.3f}" if o
                         else f"{'-':>28s}")
        lines.append(f"{nbytes:10d} " + "".join(f"{c:>28s}" for c in cells))
    return "\n".join(lines)


def crossover(rows: list[dict], fast_big: str, fast_small: str) -> int | None:
    """Smallest size from which ``fast_big`` is faster than ``fast_small`` at every larger size."""
    t = {}
    for r in rows:
        t.setdefault(r["nbytes"], {})[r["algorithm"]] = r["median_us"]
    sizes_ = sorted(s for s in t if fast_big in t[s] and fast_small in t[s])
    cross = None
    for s in reversed(sizes_):
        if t[s][fast_big] < t[s][fast_small]:
            cross = s
        else:
            break
    return cross


def crossover_claim(rows: list[dict], fast_big: str, fast_small: str) -> dict:
    """The crossover (``crossover``) and whether the rows it rests on support it: at every
    size from it up, ``fast_big``'s interquartile range must lie below ``fast_small``'s.
    ``overlaps``: the sizes from the crossover up where the two ranges overlap (the medians'
    order there is as likely noise as a difference); ``firm``: a crossover and no overlap."""
    cross = crossover(rows, fast_big, fast_small)
    by = {(r["nbytes"], r["algorithm"]): r for r in rows}
    overlaps = []
    if cross is not None:
        for nbytes in sorted({r["nbytes"] for r in rows if r["nbytes"] >= cross}):
            big, small = by.get((nbytes, fast_big)), by.get((nbytes, fast_small))
            if big is not None and small is not None and not big.get("q3_us", big["median_us"]) \
                    < small.get("q1_us", small["median_us"]):
                overlaps.append(nbytes)
    return {"size": cross, "firm": cross is not None and not overlaps, "overlaps": overlaps}


def crossover_line(claim: dict, fast_big: str, fast_small: str) -> str:
    """The printed verdict: a firm crossover, one marked uncertain (naming the sizes whose
    interquartile ranges overlap), or none."""
    cross = claim["size"]
    if cross is None:
        return f"# {fast_big} never faster than {fast_small} at the largest sizes measured"
    if claim["firm"]:
        return (f"# {fast_big} faster than {fast_small} from {human(cross)} up (interquartile "
                "ranges apart at every one of those sizes)")
    where = ", ".join(human(s) for s in claim["overlaps"])
    return (f"# {fast_big} vs {fast_small}: uncertain; the medians say {fast_big} is faster "
            f"from {human(cross)} up, but the interquartile ranges overlap at {where}, so this "
            "run cannot tell (rerun on a quieter machine, or with more --iters)")


def plot_title(result: dict) -> str:
    """What the run was: ranks, nodes, transport, dtype, op (and ``--note``, e.g. the link)."""
    nodes = result.get("nodes", 1)
    where = f"{result['n']} ranks" + (f" on {nodes} nodes" if nodes > 1 else "")
    note = f", {result['note']}" if result.get("note") else ""
    return (f"all_reduce, {where}, {result.get('backend', 'mpi').upper()} transport{note}, "
            f"{result['dtype']} {result['op']}")


def plot(result: dict, path: Path) -> Path | None:
    """busbw and latency vs size per algorithm (None without matplotlib): one colour per
    algorithm, dashed for its ``_zc`` (shared-buffer) twin, the legend beside the plots."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    names = list(dict.fromkeys(r["algorithm"] for r in result["rows"]))
    bases = list(dict.fromkeys(base_algorithm(a) if a != RAW_MPI else a for a in names))
    colours = plt.get_cmap("tab10" if len(bases) <= 10 else "tab20").colors
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 5.2))
    markers = "osD^v<>ph*"
    for name in names:
        pts = [r for r in result["rows"] if r["algorithm"] == name]
        x = [r["nbytes"] for r in pts]
        k = bases.index(base_algorithm(name) if name != RAW_MPI else name)
        style = dict(marker=markers[k % len(markers)], markersize=4, label=name,
                     color=colours[k % len(colours)],
                     ls="--" if "_zc" in name else ":" if name.endswith("-off") else "-",
                     lw=2.6 if name in ("mpi", "auto") else 1.4)
        ax1.plot(x, [r["busbw_GBps"] for r in pts], **style)
        ax2.plot(x, [r["median_us"] for r in pts], **style)
    for ax, title in ((ax1, "bus bandwidth (GB/s, higher is better)"),
                      (ax2, "median time per call (us, lower is better)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.set_title(title, fontsize=11)
        ax.grid(alpha=0.3)
    ax2.set_yscale("log")
    handles, labels = ax1.get_legend_handles_labels()
    fig.legend(handles, labels, loc="center right", fontsize=10, frameon=False)
    fig.suptitle(plot_title(result), fontsize=12)
    fig.tight_layout(rect=(0, 0, 0.88, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def markdown(result: dict) -> str:
    """A compact Markdown table: median us per algorithm per size, auto's pick and its ratio to
    the best of our own algorithms (plain buffers; ``auto_zc``: on a shared buffer), busbw."""
    algos = [a for a in dict.fromkeys(r["algorithm"] for r in result["rows"]) if a != "direct"]
    by = {(r["nbytes"], r["algorithm"]): r for r in result["rows"]}
    autos = [a for a in ("auto", "auto_zc") if a in algos]
    vs_gloo = [a for a in algos if a != "gloo"] if "gloo" in algos else []
    head = (["size"] + [f"{a} (us)" for a in algos] + [f"{a}/gloo" for a in vs_gloo]
            + [c for a in autos for c in (f"{a} chose", f"{a}/best ours")]
            + ["best busbw (GB/s)", "#wrong"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for nbytes in sorted({r["nbytes"] for r in result["rows"]}):
        pts = [by[(nbytes, a)] for a in algos if (nbytes, a) in by]
        best = min(pts, key=lambda r: r["median_us"])
        cells = [human(nbytes)] + [f"{by[(nbytes, a)]['median_us']:.0f}" if (nbytes, a) in by
                                   else "-" for a in algos]
        cells += [f"{by[(nbytes, a)]['ratio_to_gloo']:.2f}" if (nbytes, a) in by else "-"
                  for a in vs_gloo]
        for a in autos:
            r = by.get((nbytes, a), {})
            ratio = r.get("ratio_to_best_ours")
            cells += [r.get("chose", "-"),
                      f"{ratio:.2f} ({r['best_ours']})" if ratio is not None else "-"]
        cells += [f"{best['busbw_GBps']:.2f} ({best['algorithm']})",
                  str(sum(r["wrong"] for r in pts))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------- fitting the "auto" rule

TOLERANCE = 0.05  # algorithms within 5 % of the fastest (median of run medians) count as tied


def medians_over_runs(paths: list[str]) -> dict:
    """{(n, nbytes, algorithm): [median of run 1, run 2, ...]} from benchmark JSON files."""
    out: dict = {}
    for p in paths:
        d = json.loads(Path(p).read_text())
        for r in d["rows"]:
            out.setdefault((d["n"], r["nbytes"], r["algorithm"]), []).append(r["median_us"])
    return out


def size_rules(times: dict[int, dict[str, float]], tol: float = TOLERANCE) -> list:
    """Thresholds from per-size times: ``calibrate.size_rules`` (``python -m minidist.tune``
    fits its rules with the same function)."""
    from minidist.auto.calibrate import size_rules as fit_rules

    return fit_rules(times, tol)


def write_defaults(path: Path, data: dict) -> None:
    """Write the fit as the shipped table of "auto" (JSON package data that select.py loads at
    import; ``python -m minidist.tune`` replaces it on a user's machine)."""
    about = json.loads(path.read_text()).get("about", "") if path.exists() else ""
    table = {"format": 1, "about": about, "source": data["source"],
             "model": data["model"], "rules": data["rules"]}
    tmp = path.with_suffix(".json.tmp")  # then rename: a concurrent import never sees half a file
    tmp.write_text(json.dumps(table, indent=1) + "\n")
    os.replace(tmp, path)


def fit(paths: list[str], out: Path, module: Path | None = None) -> dict:
    """The "auto" rule and alpha-beta constants from one or more (repeated) benchmark runs.

    Every (world size, size, algorithm) gets the MEDIAN of its per-run medians (robust to one
    noisy run). Rules: per world size and buffer kind (plain, or shared: the ``*_zc`` rows),
    ``size_rules`` over the candidates of ``select.CANDIDATES``. Model (for world sizes and
    transports without rules): each cost formula in ``select.COST`` is linear in (alpha, beta,
    gamma), so alpha and beta are a least-squares fit on relative error, gamma a NumPy add.
    """
    from minidist.auto import select

    med = {k: float(np.median(v)) for k, v in medians_over_runs(paths).items()}
    rules: dict = {}
    for n in sorted({k[0] for k in med if k[0] > 1}):
        for zc in (False, True):
            times: dict = {}
            for (m, nbytes, name), t in med.items():
                base = name.removesuffix("_zc")
                if m == n and name.endswith("_zc") == zc and base in select.CANDIDATES:
                    times.setdefault(nbytes, {})[base] = t
            complete = {s: v for s, v in times.items() if len(v) >= 2}
            if complete:
                rules[f"{n}s" if zc else str(n)] = size_rules(complete)
    from minidist.auto.calibrate import fit_model

    points: dict = {}
    for (n, nbytes, name), t in med.items():
        points.setdefault(name, []).append((n, nbytes, t))
    gamma = gamma_us_per_byte()
    model, report = fit_model(points, gamma)
    data = {"model": model, "rules": rules, "tolerance": TOLERANCE,
            "source": [str(p) for p in paths],
            "note": "fitted by benchmarks/allreduce.py --fit; load with select.load_model()"}
    write_json(out, data)
    if module is not None:
        write_defaults(module, data)
        print(f"# wrote {shown(module)} (the shipped table: select.py loads it at import)")
    print(f"# fitted constants (gamma = {gamma:.3e} us/B from a NumPy add) -> {shown(out)}")
    print("# algorithm   alpha(us)   beta(us/B)   median |rel err|")
    for name, a, b, e in report:
        print(f"  {name:9s} {a:11.2f} {b:12.3e} {e:14.1%}")
    for key, rule in rules.items():
        print(f"# rule n={key}: " + ", ".join(f"< {human(u)}: {a}" if u else f"else {a}"
                                              for u, a in rule))
    return data


def gamma_us_per_byte(nbytes: int = 16 << 20) -> float:
    """Microseconds per byte of an in-place float32 add at ``nbytes`` (the reduce cost)."""
    a = np.ones(nbytes // 4, np.float32)
    b = np.ones_like(a)
    best = min(_timed(lambda: np.add(a, b, out=a)) for _ in range(5))
    return best * 1e6 / nbytes


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# ---------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if isinstance(args, tuple):
        fit(args[1], args[2], args[3])
        return 0
    load_start = load_average()  # before the ranks load the machine themselves
    stop = StopRequest()  # before the group: minidist then leaves Ctrl-C to this script
    from minidist.comm.api import destroy_process_group, init_process_group

    group = init_process_group(backend=args.backend)
    gloo = None
    result: dict = {}
    try:
        if args.gloo:
            gloo = start_gloo(group)
            if gloo is not None:
                args.algorithms = [*args.algorithms, "gloo"]
        if group.size < 2 and group.rank == 0:
            print("# note: one rank; every all_reduce is a no-op (run under ./mpirun.sh -n 2)")
        busy = busy_note(load_start)
        if busy and group.rank == 0:
            print(f"# note: {busy}", flush=True)
        t0 = time.perf_counter()
        stop.arm()
        result = sweep(args, group, gloo, stop=lambda: stop.agreed(group))
        result["elapsed_s"] = time.perf_counter() - t0
        result["load_average"] = {"start": load_start, "end": load_average()}
        stem = args.name or default_stem(group)
        extra = library_versions(group, gloo)
    finally:
        if group.backend == "mpi":
            from minidist.fastpath.shm import shm_close
            shm_close(group.transport)  # collective: free the windows before MPI goes away
        if gloo is not None:
            import torch.distributed as td
            td.destroy_process_group()
        rank = group.rank
        destroy_process_group()
        stop.restore()
    if rank == 0:  # after the group is gone: no peer waits (and warns) while this one writes
        report(args, stem, extra, result)
    return StopRequest.exit_code if result.get("interrupted") else 0


def library_versions(group: Any, gloo: Callable | None) -> dict:
    """The MPI library's name and version (and torch's, with gloo) for the JSON."""
    extra = {"mpi_library": ""}
    if getattr(group.transport, "comm", None) is not None:
        from mpi4py import MPI
        extra["mpi_library"] = MPI.Get_library_version().splitlines()[0].strip()
    if gloo is not None:
        import torch
        extra["torch"] = torch.__version__
    return extra


NOISY_SPREAD = 0.25  # a row whose interquartile range exceeds this fraction of its median


def report(args: Args, stem: str, extra: dict, result: dict) -> None:
    """Rank 0, after the sweep: write the JSON (+ plot) and print the verdicts, or after a
    Ctrl-C write what was measured and print one line."""
    noisy = [r for r in result["rows"] if r["spread"] > NOISY_SPREAD]
    result.update({"machine": machine_info(extra), "command": " ".join(sys.argv),
                   "noisy_rows": {"threshold": NOISY_SPREAD, "count": len(noisy),
                                  "of": len(result["rows"])}})
    result = {k: result[k] for k in ("machine", "command", "elapsed_s", "load_average")} | result
    load = result["load_average"]
    interrupted = result["interrupted"]
    if interrupted and not result["rows"]:
        print("# interrupted (Ctrl-C) before the first size was measured: nothing to save",
              file=sys.stderr, flush=True)
        return
    path = write_json(args.out / f"{stem}.json", result)
    png = plot(result, args.out / f"{stem}.png") if args.plot else None
    files = shown(path) + (f" and {shown(png)}" if png else "")
    if interrupted:
        print(f"# interrupted (Ctrl-C) after {interrupted['sizes_done']} of "
              f"{interrupted['sizes_planned']} sizes: wrote the rows measured so far to {files}",
              file=sys.stderr, flush=True)
        return
    if noisy:
        worst = max(noisy, key=lambda r: r["spread"])
        print(f"# noisy: {len(noisy)} of {len(result['rows'])} rows have an interquartile range "
              f"above {NOISY_SPREAD:.0%} of their median (widest: {worst['algorithm']} at "
              f"{human(worst['nbytes'])}, {worst['spread']:.2f}); compare those rows with care")
    busy = busy_note(load["start"])
    if busy:
        print(f"# note: {busy}")
    measured = {r["algorithm"] for r in result["rows"]}
    if {"ring", "tree"} <= measured:  # else there is nothing to compare
        print(crossover_line(result["ring_vs_tree"], "ring", "tree"))
    print(f"# wrote {files}", flush=True)


def default_stem(group: Any) -> str:
    """``allreduce_n{N}`` for MPI on one node (the published results' names); otherwise the
    transport and the node layout are in the name, so such a run never overwrites those."""
    nodes = group.topology.num_nodes
    if group.backend == "mpi" and nodes == 1:
        return f"allreduce_n{group.size}"
    return f"allreduce_{group.backend}_{nodes}x{group.size // nodes}"


def known_algorithms() -> list[str]:
    """Every row name ``--algorithms`` takes: the public algorithms, their ``_zc`` twins (a
    buffer in the shared-memory window) and ``-off`` twins (no ledger entry), and mpi_raw."""
    plain = [a for a in PUBLIC_ALGOS if a != RAW_MPI]
    names = plain + [a + "_zc" for a in plain]
    return names + [a + "-off" for a in names] + [RAW_MPI]


if __name__ == "__main__":
    sys.exit(main())
