"""DDP scaling benchmark: step time and samples/s at n = 1, 2, 4; overlap on/off; bucket sizes.

    .venv/bin/python benchmarks/ddp_scaling.py                 # driver: launches n = 1, 2, 4 itself
    ./mpirun.sh -n 2 python benchmarks/ddp_scaling.py   # one world size, table for that n
    .venv/bin/python benchmarks/ddp_scaling.py --sizes 1 2 --steps 10 --quick    # a faster look
    .venv/bin/python benchmarks/ddp_scaling.py --out benchmarks/results   # the published results
                                                        # (default: runs/bench/, git-ignored)
    .venv/bin/python benchmarks/ddp_scaling.py --sizes 2 --quick --rounds 1 --trace /tmp/tr
        # + a step timeline per rank (minidist/tracing.py): /tmp/tr/n2/trace.json, drawn by
        # benchmarks/plot_trace.py (tracing adds a little time to every step: not for the table)
    .venv/bin/python benchmarks/ddp_scaling.py --amp --quick  # + AMP rows: the cost of loss scaling
    .venv/bin/python benchmarks/ddp_scaling.py --models large --quick --paired 200
        # the reference workload only, + DDP's overhead step by step (plain and DDP steps
        # alternate: the ratio holds up on a machine shared with other jobs), and its floor
        # without overlap: the buckets' all-reduce and NaN/inf check, each timed alone, and
        # the reduction's own loop on private arrays (what an ideal all-reduce would cost)
    .venv/bin/python benchmarks/ddp_scaling.py --sizes 2 --models large --quick --hooks 300
        # + one DDP model whose comm hook changes every step: what the default (one
        # all-reduce AVG) costs beside the division folded into backward and the textbook
        # divide-then-sum

Models (float32, SGD lr 0.01, synthetic data, batch 64 PER RANK):
    small   MLP 64-256-10          (19k parameters: latency-bound all-reduce)
    large   MLP 784-1024-1024-10   (1.86M parameters, 7.5 MB of gradients)

Per configuration: warm-up steps, a barrier, then the median over timed steps of one full
step (forward, backward with its bucket all-reduces, optimizer step, zero_grad). "exposed comm"
is the time backward spent WAITING for reductions after its last gradient was written (what
overlap did not hide); compute = step - exposed comm. "step / n=1 plain step" is a ratio of
STEP TIMES, not a speed-up: 1.30x at n=2 means each step takes 1.30 times the one-process
plain step, while the two ranks together process 2 / 1.30 = 1.54 times the samples per second
(the samples/s column). "plain" rows run the model without DDP
(no communication at all): at n=1 the baseline of the 1.25x target; at n>1, n independent
copies side by side, which shows what the machine itself loses when n processes share its
cores and memory bandwidth. "cpu" is the median CPU time of this process per step (all its
threads; spin-waits in barriers count): on a machine shared with other jobs it moves less
than wall time, so it shows what work DDP adds even when the step times are noisy. The footer
gives, per n, DDP's step over the plain step of the same n processes (wall and CPU time).

AMP (``--amp``): two more rows per model, overlap off, beside the plain DDP row of the same
setting. "amp=scaler" adds only the GradScaler to the DDP step (scale the loss, unscale each
bucket with the fused kernel in place of DDP's finiteness check, read found_inf in step(),
update the scale): the AMP overhead per DDP step. "amp=autocast" also runs forward under
autocast, which on the CPU EMULATES float16 (float32 BLAS plus rounding), so it measures the
emulation, not what a GPU gains. The footer also times the fused unscale of one 1.86M-float
bucket next to the finiteness check it replaces.

Memory, per configuration, in a separate untimed pass: ``tracemalloc`` traced from before the
model is built through 3 steps (NumPy reports its array allocations to it), plus the bucket
buffers DDP placed in shared-memory windows (MPI allocates those, tracemalloc cannot see
them). "peak mem" is that peak in MiB per rank (max over ranks); DDP minus plain is what DDP
costs on top of a single process (target: at most one more copy of the gradients). The whole
process's ``ru_maxrss`` (MPI, interpreter, every configuration) is printed at the bottom.

Output: tables on stdout (rank 0); the driver writes ddp_scaling.json and ddp_scaling.txt (the
table) into ``--out`` (default runs/bench/, git-ignored; the published results in
benchmarks/results/ come from ``--out benchmarks/results``), a single launch under mpirun.sh
ddp_scaling_nN.json (with --amp: ddp_scaling_amp.json, ddp_scaling_amp.txt,
ddp_scaling_amp_nN.json; with --trace: ddp_scaling_trace.json, ...).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import minidist  # noqa: E402
from minidist import amp, comm, kernels, nn, optim  # noqa: E402
from minidist import tracing as trace  # noqa: E402
from minidist.fastpath.shm import shm_is_shared  # noqa: E402
from minidist.kernels import reduce_cpu  # noqa: E402
from minidist.ddp import DistributedDataParallel, auto_overlap  # noqa: E402
from minidist.ddp.hooks import (allreduce_hook, avg_allreduce_hook,  # noqa: E402
                                prescaled_allreduce_hook)
from minidist.watch.nonfinite import all_finite_fast  # noqa: E402
from minidist.tensor import Tensor  # noqa: E402

sys.path.insert(0, str(REPO / "benchmarks"))
from _common import (LOCAL_RESULTS, Parser, mpiexec_path, one_thread_env, shown,  # noqa: E402
                     usage_error)
MODELS = {"small": (64, [256], 10), "large": (784, [1024, 1024], 10)}
BATCH = 64


def build(name: str) -> nn.Module:
    d_in, hidden, d_out = MODELS[name]
    minidist.manual_seed(0)
    layers, prev = [], d_in
    for h in hidden:
        layers += [nn.Linear(prev, h), nn.ReLU()]
        prev = h
    return nn.Sequential(*layers, nn.Linear(prev, d_out))


def time_steps(model_name: str, use_ddp: bool, steps: int, warmup: int,
               **ddp_kw) -> tuple[list[float], list[float], list[float]]:
    """Step times, exposed-communication times and CPU times (seconds) of ``steps`` timed
    steps."""
    times, exposed, _, cpu = run_steps(model_name, use_ddp, steps, warmup, **ddp_kw)
    return times, exposed, cpu


def peak_memory_mib(model_name: str, use_ddp: bool, **ddp_kw) -> float:
    """Peak MiB of everything a training step allocates (see the module docstring)."""
    tracemalloc.start()
    try:
        _, _, shared, _ = run_steps(model_name, use_ddp, 3, 0, **ddp_kw)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return (peak + shared) / 2**20


def run_steps(model_name: str, use_ddp: bool, steps: int, warmup: int,
              **ddp_kw) -> tuple[list[float], list[float], int, list[float]]:
    """(step times, exposed comm times, bytes of DDP buckets in shared windows, CPU times)."""
    rank = comm.get_rank()
    amp_mode = ddp_kw.pop("amp", None)  # None | "scaler" | "autocast"
    scaler = amp.GradScaler(enabled=amp_mode is not None)
    model = build(model_name)
    net = DistributedDataParallel(model, **ddp_kw) if use_ddp else model
    opt = optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    d_in, _, d_out = MODELS[model_name]
    rng = np.random.default_rng(rank)
    x = rng.normal(size=(BATCH, d_in)).astype(np.float32)
    y = rng.integers(0, d_out, BATCH)
    times, exposed, cpu = [], [], []
    tr = trace.tracer()  # --trace: the step timeline; None otherwise
    for i in range(warmup + steps):
        if i == warmup:
            comm.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        with amp.autocast("cpu", enabled=amp_mode == "autocast"):
            loss = loss_fn(net(Tensor(x)), y)
        scaler.scale(loss).backward()
        t_opt = time.perf_counter()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        t1, c1 = time.perf_counter(), time.process_time()
        if tr is not None:
            args = {"model": model_name, "ddp": use_ddp, "i": i, **ddp_kw}
            tr.complete("optimizer.step", t_opt, t1, args=args)
            tr.complete(f"step {i}", t0, t1, args=args)
        if i >= warmup:
            times.append(t1 - t0)
            cpu.append(c1 - c0)
            exposed.append(net.last_step_stats["wait_s"] if use_ddp else 0.0)
    shared = 0
    if use_ddp:
        group = comm.get_default_group()
        if group.size > 1 and group.backend == "mpi":
            shared = sum(b.nbytes for b in net.buckets
                         if shm_is_shared(group.transport, b.buffer))
        net.close(release_buffers=True)  # collective: frees the buckets' shared windows
    return times, exposed, shared, cpu


def summarize(model_name: str, use_ddp: bool, times: list[float], exposed: list[float],
              cpu: list[float], mem_mib: float, **ddp_kw) -> dict:
    """Medians; the slowest rank sets the pace, so each is the max over ranks."""
    world = comm.get_world_size()
    med = np.array([statistics.median(times), statistics.median(exposed), mem_mib,
                    statistics.median(cpu)])
    comm.all_reduce(med, op="max")
    step, wait = float(med[0]), float(med[1])
    return {"model": model_name, "n": world, "ddp": use_ddp, **ddp_kw,
            "step_ms": step * 1e3, "exposed_comm_ms": wait * 1e3, "cpu_ms": float(med[3]) * 1e3,
            "compute_ms": (step - wait) * 1e3, "samples_per_s": BATCH * world / step,
            "peak_mem_mib": float(med[2])}


def batch_of(model_name: str) -> tuple[Tensor, np.ndarray, Any]:
    """One fixed batch per rank (seeded by the rank) and the loss, for the step-by-step timings."""
    d_in, _, d_out = MODELS[model_name]
    rng = np.random.default_rng(comm.get_rank())
    x = Tensor(rng.normal(size=(BATCH, d_in)).astype(np.float32))
    return x, rng.integers(0, d_out, BATCH), nn.CrossEntropyLoss()


def paired_steps(model_name: str, pairs: int, warmup: int) -> dict:
    """DDP's overhead measured step by step: a plain model and a DDP model (overlap "auto")
    of the same n processes take turns, two steps each (the second timed), ``pairs`` times
    (the order rotates). A burst of load from other jobs then hits both sides of a round
    alike, so the median of the per-round ratios resolves a few percent where
    whole-configuration medians on a shared machine cannot. Only the second step is timed:
    right after the other model's step, a model's weights and gradients are out of cache, and
    a warm step compared with a cold one would measure the cache, not DDP (the per-round
    ratios then split into two clusters, and their median lands in either). Each step is
    timed on the slowest rank (the job's pace). Returns
    the medians of those steps and of their per-pair ratios (the CPU-time ratio: max over
    ranks of each rank's median), and ``bucket_work``'s floor."""
    x, y, loss_fn = batch_of(model_name)
    sides = []
    for kind in ("plain", "ddp"):
        model = build(model_name)
        net = model if kind == "plain" else DistributedDataParallel(model)
        sides.append((net, optim.SGD(model.parameters(), lr=0.01)))

    def step(side: int) -> tuple[float, float]:
        net, opt = sides[side]
        # Untimed: the ranks start each step together, as consecutive DDP steps do (each
        # leaves its all-reduce together). Without it a DDP step would also wait out how far
        # apart the ranks drifted during the unsynchronized plain step before it.
        comm.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        loss_fn(net(x), y).backward()
        opt.step()
        opt.zero_grad()
        return time.perf_counter() - t0, time.process_time() - c0

    wall: list[list[float]] = [[], []]
    cpu: list[list[float]] = [[], []]
    in_step: list[float] = []  # the DDP side's exposed communication (``wait_s``)
    for i in range(warmup + pairs):
        if i == warmup:
            comm.barrier()
        for j in range(2):  # rotate who goes first
            side = (i + j) % 2
            step(side)  # untimed: the timed step below finds its model in cache, as a training
            t, c = step(side)  # step does after the step before it (a cold step is slower)
            if i >= warmup:
                wall[side].append(t)
                cpu[side].append(c)
                if side == 1:
                    in_step.append(sides[1][0].last_step_stats["wait_s"])
    reduce_s, check_s, traffic_s = bucket_work(sides[1][0], max(pairs // 4, 5))
    sides[1][0].close(release_buffers=True)
    # Per step, the slowest rank's time: a job moves at the pace of its slowest rank, and a
    # DDP step takes as long on every rank, so a faster rank's own plain step is no baseline.
    slowest = np.array(wall, dtype=np.float64)  # [side][pair]
    comm.all_reduce(slowest, op="max")
    ratios = slowest[1] / slowest[0]
    cpu_ratios = [d / p for p, d in zip(cpu[0], cpu[1])]
    med = np.array([np.median(slowest[0]), np.median(slowest[1]), np.median(ratios),
                    statistics.median(cpu_ratios), reduce_s, check_s, statistics.median(in_step),
                    traffic_s])
    comm.all_reduce(med, op="max")
    plain, reduce_, check, traffic = float(med[0]), float(med[4]), float(med[5]), float(med[7])
    return {"model": model_name, "n": comm.get_world_size(), "pairs": pairs,
            "plain_ms": plain * 1e3, "ddp_ms": float(med[1]) * 1e3,
            "ratio": float(med[2]), "cpu_ratio": float(med[3]),
            "allreduce_ms": reduce_ * 1e3, "finite_check_ms": check * 1e3,
            "allreduce_in_step_ms": float(med[6]) * 1e3,
            "floor_ratio": (plain + reduce_ + check) / plain,
            "private_loop_ms": traffic * 1e3,
            "private_floor_ratio": (plain + traffic + check) / plain,
            "overlap": auto_overlap(comm.get_world_size())}


def bucket_work(ddp: DistributedDataParallel, repeats: int) -> tuple[float, float, float]:
    """The work a DDP step adds that no code change can remove without overlap (medians, s):
    the model's comm hook on every bucket (after a barrier: no rank waits for a slower one)
    and the NaN/inf check of every bucket as DDP makes it (nothing more where the
    shared-memory all-reduce already checked the bucket in cache), outside a step; and, for scale,
    the reduction's own loop on private arrays (``private_loop``)."""
    reducer = ddp.reducer
    shared = getattr(ddp.process_group or comm.get_default_group(), "shared_memory", None)
    reduce_s, check_s, traffic_s = [], [], []
    for _ in range(repeats):
        comm.barrier()
        reduce_t = check_t = 0.0
        for b in ddp.buckets:
            t0 = time.perf_counter()
            reducer.comm_hook(reducer.hook_state, b)  # the default: one all-reduce AVG
            t1 = time.perf_counter()
            # the check as DDP makes it (watch/nonfinite.py): the verdict the shared-memory
            # all-reduce found in cache, else one dot product of the reduced bucket
            verdict = None if shared is None else shared.reduced_finite(b.buffer)
            if verdict is None:
                all_finite_fast(b.buffer)
            reduce_t += t1 - t0
            check_t += time.perf_counter() - t1
        reduce_s.append(reduce_t)
        check_s.append(check_t)
    traffic = traffic_arrays(ddp.buckets, comm.get_world_size())  # made (and touched) only now
    for _ in range(repeats):  # a loop of its own: its arrays do not evict the buckets above
        comm.barrier()  # both ranks at once, as in the all-reduce: they share the memory bus
        t0 = time.perf_counter()
        private_loop(traffic)
        traffic_s.append(time.perf_counter() - t0)
    return statistics.median(reduce_s), statistics.median(check_s), statistics.median(traffic_s)


def traffic_arrays(buckets: list, n: int) -> list[tuple[np.ndarray, ...]]:
    """Private arrays for ``private_loop``: per bucket, n arrays of 1/n of it (what one rank
    reduces: its slice in each of the n ranks' buffers)."""
    return [tuple(np.ones(-(-b.buffer.size // n), b.buffer.dtype) for _ in range(n))
            for b in buckets]


def private_loop(arrays: list[tuple[np.ndarray, ...]]) -> None:
    """One rank's share of the shared-memory all-reduce, run by its own loop
    (``kernels/reduce_cpu.py:sum_to_all``: read the n copies of its slice, write the average
    to all n) on private arrays: no barrier, no plan, no bookkeeping, no cache line shared with
    another process. What the reduction costs if only its bytes did."""
    for slices in arrays:
        reduce_cpu.sum_to_all(slices, len(slices))


AVERAGING_HOOKS = {"avg_allreduce_hook (the default: one all-reduce AVG)": avg_allreduce_hook,
                   "prescaled_allreduce_hook (the division folded into backward)":
                       prescaled_allreduce_hook,
                   "allreduce_hook (divide the bucket by n, then all-reduce the sum)":
                       allreduce_hook}


def hook_steps(model_name: str, rounds: int, warmup: int) -> dict:
    """What each way to average costs: ONE DDP model whose comm hook changes every step
    (``AVERAGING_HOOKS``, the order rotating per round), so every hook runs on the same
    buckets, the same memory and the same load. Returns per hook the median step (max over
    ranks) and the median of its per-round difference from the default."""
    x, y, loss_fn = batch_of(model_name)
    model = build(model_name)
    ddp = DistributedDataParallel(model)
    opt = optim.SGD(model.parameters(), lr=0.01)
    hooks = list(AVERAGING_HOOKS.values())
    wall: list[list[float]] = [[] for _ in hooks]
    for i in range(warmup + rounds):
        if i == warmup:
            comm.barrier()
        for j in range(len(hooks)):
            k = (i + j) % len(hooks)
            ddp.register_comm_hook(None, hooks[k])
            t0 = time.perf_counter()
            loss_fn(ddp(x), y).backward()
            opt.step()
            opt.zero_grad()
            if i >= warmup:
                wall[k].append(time.perf_counter() - t0)
    ddp.close(release_buffers=True)
    med = np.array([statistics.median(w) for w in wall]
                   + [statistics.median([b - a for a, b in zip(wall[0], w)]) for w in wall])
    comm.all_reduce(med, op="max")
    return {"model": model_name, "n": comm.get_world_size(), "rounds": rounds,
            "hooks": {name: {"ms": float(med[i]) * 1e3,
                             "over_default_ms": float(med[len(hooks) + i]) * 1e3}
                      for i, name in enumerate(AVERAGING_HOOKS)}}


def finite_check_cost_ms(numel: int, repeats: int = 20) -> float:
    """What DDP's NaN/inf check (one dot product per bucket) costs on ``numel`` floats."""
    buf = np.random.default_rng(0).normal(size=numel).astype(np.float32)
    t0 = time.perf_counter()
    for _ in range(repeats):
        all_finite_fast(buf)
    return (time.perf_counter() - t0) / repeats * 1e3


def fused_unscale_cost_ms(numel: int, repeats: int = 20) -> float:
    """What the AMP fold (unscale + inf/NaN flag, one kernel call) costs on ``numel`` floats."""
    buf = np.random.default_rng(0).normal(size=numel).astype(np.float32)
    found = np.zeros(1, np.float32)
    inv = np.ones(1, np.float32)  # 1.0: the buffer stays the same across repeats
    kernels.unscale_and_check_(buf, buf, inv, found)  # warm-up (a compiled kernel compiles)
    t0 = time.perf_counter()
    for _ in range(repeats):
        kernels.unscale_and_check_(buf, buf, inv, found)
    return (time.perf_counter() - t0) / repeats * 1e3


def worker(args: argparse.Namespace) -> dict:
    comm.init_process_group()
    world = comm.get_world_size()
    if args.trace:
        trace.start(Path(args.trace) / f"n{world}", comm.get_rank(), world)
    configs: list[tuple[str, bool, dict]] = []
    for model_name in args.models:
        configs.append((model_name, False, {}))  # no DDP: n copies side by side
        configs += [(model_name, True, {"overlap": True}), (model_name, True, {"overlap": False})]
    if not args.quick:
        configs += [("large", True, {"overlap": True, "bucket_cap_mb": cap})
                    for cap in (1, 5, 25, 100) if "large" in args.models]
    if args.amp:
        configs += [(m, True, {"overlap": False, "amp": mode})
                    for m in args.models for mode in ("scaler", "autocast")]
    # Round-robin over the configurations, several rounds: on a shared, noisy machine a
    # burst of load then hits every configuration alike instead of one of them.
    samples: dict[int, tuple[list[float], ...]] = {i: ([], [], []) for i in range(len(configs))}
    for _ in range(args.rounds):
        for i, (model_name, use_ddp, kw) in enumerate(configs):
            for got, kept in zip(time_steps(model_name, use_ddp, args.steps, args.warmup,
                                            **dict(kw)), samples[i]):
                kept.extend(got)
    mem = [peak_memory_mib(m, u, **dict(kw)) for m, u, kw in configs]
    rows = [summarize(m, u, *samples[i], mem[i], **kw) for i, (m, u, kw) in enumerate(configs)]
    maxrss = np.array([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0])
    all_rss = comm.all_gather(maxrss).reshape(-1).tolist()
    out = {"world_size": world, "rows": rows, "peak_rss_mib_per_rank": all_rss,
           "overlap_auto": auto_overlap(world),
           "finite_check_ms_1.86M": finite_check_cost_ms(1_863_690), "_rank": comm.get_rank()}
    if args.paired:
        out["paired"] = [paired_steps(m, args.paired, args.warmup)
                         for m in args.models]
    if args.hooks:
        out["hooks"] = [hook_steps(m, args.hooks, args.warmup) for m in args.models]
    if args.trace:
        trace.stop()
        comm.barrier()  # every rank's file is written
        if comm.get_rank() == 0:
            print(f"# trace: {trace.merge(Path(args.trace) / f'n{world}')}", flush=True)
    if args.amp:
        out["fused_unscale_ms_1.86M"] = fused_unscale_cost_ms(1_863_690)
        which = getattr(kernels, "implementation", None)  # which backend ran (newer kernels)
        out["kernels"] = which(np.zeros(1, np.float32)) if which else "reference"
    comm.barrier()
    comm.destroy_process_group()
    return out


def table(results: list[dict]) -> str:
    lines = ["# model  n  config                 step [ms]  step / n=1 plain step  compute [ms]"
             "  exposed comm [ms]  samples/s  peak mem [MiB]  cpu [ms]"]
    base = {r["model"]: r["step_ms"] for res in results for r in res["rows"]
            if r["n"] == 1 and not r["ddp"]}
    for res in results:
        for r in res["rows"]:
            cfg = "plain (no DDP)" if not r["ddp"] else (
                f"overlap={'on ' if r['overlap'] else 'off'}"
                + (f" cap={r['bucket_cap_mb']}MiB" if "bucket_cap_mb" in r else "")
                + (f" amp={r['amp']}" if "amp" in r else "")
                + (f" {r['algorithm']}" if "algorithm" in r else ""))
            ratio = (f"{r['step_ms'] / base[r['model']]:.2f}x" if r["model"] in base else "-")
            lines.append(f"  {r['model']:<6} {r['n']}  {cfg:<22} {r['step_ms']:9.2f}  "
                         f"{ratio:>21}  {r['compute_ms']:12.2f}  {r['exposed_comm_ms']:17.2f}  "
                         f"{r['samples_per_s']:9.0f}  "
                         f"{r.get('peak_mem_mib', float('nan')):14.1f}  "
                         f"{r.get('cpu_ms', float('nan')):8.2f}")
    for res in results:
        lines.append(f"# n={res['world_size']}: overlap='auto' picks "
                     f"{'on' if res.get('overlap_auto') else 'off'}; whole-process peak RSS "
                     f"per rank [MiB] {[round(v, 1) for v in res['peak_rss_mib_per_rank']]}; "
                     f"NaN/inf check of a 1.86M-float bucket: "
                     f"{res['finite_check_ms_1.86M']:.2f} ms")
    lines += overhead_lines(results)
    lines += amp_overhead_lines(results)
    return "\n".join(lines)


def overhead_lines(results: list[dict]) -> list[str]:
    """DDP's cost at each n: its step over the plain step of the same n processes, which run
    the same model on the same cores without communicating (the overlap that "auto" picks)."""
    lines = []
    for res in results:
        rows = res["rows"]
        for model in dict.fromkeys(r["model"] for r in rows):
            plain = next((r for r in rows if r["model"] == model and not r["ddp"]), None)
            ddp = next((r for r in rows if r["model"] == model and r["ddp"] and
                        r.get("overlap") is bool(res.get("overlap_auto")) and
                        "amp" not in r and "bucket_cap_mb" not in r), None)
            if plain is None or ddp is None:
                continue
            lines.append(f"# n={res['world_size']} {model}: DDP step / plain step of the same "
                         f"{res['world_size']} process(es) = {ddp['step_ms']:.2f} / "
                         f"{plain['step_ms']:.2f} ms = {ddp['step_ms'] / plain['step_ms']:.3f}x; "
                         f"CPU time {ddp['cpu_ms'] / plain['cpu_ms']:.3f}x "
                         f"(overlap={'on' if ddp['overlap'] else 'off'}, as 'auto' picks)")
        for r in res.get("paired", []):
            lines.append(f"# n={r['n']} {r['model']} paired ({r['pairs']} rounds, two steps per "
                         f"side, the second timed): "
                         f"plain {r['plain_ms']:.2f} ms, DDP {r['ddp_ms']:.2f} ms; median of "
                         f"per-pair DDP/plain {r['ratio']:.3f}x, CPU time {r['cpu_ratio']:.3f}x")
            if "floor_ratio" not in r:  # (results saved before the floor was measured)
                continue
            lines.append(f"#   of which alone: the buckets' all-reduce {r['allreduce_ms']:.2f} ms,"
                         f" their NaN/inf check {r['finite_check_ms']:.2f} ms: a DDP step without"
                         f" overlap can be no faster than (plain + both) / plain = "
                         f"{r['floor_ratio']:.3f}x; inside a DDP step, from its last gradient "
                         f"to the end of the reduction (both, and waiting for the slower rank): "
                         f"{r['allreduce_in_step_ms']:.2f} ms")
            if "private_floor_ratio" in r:
                lines.append(f"#   the reduction's loop alone, on private arrays (no barrier, no "
                             f"bookkeeping, no shared lines): {r['private_loop_ms']:.2f} ms; "
                             f"even then (plain + that + check) / plain = "
                             f"{r['private_floor_ratio']:.3f}x")
        for r in res.get("hooks", []):
            lines.append(f"# n={r['n']} {r['model']}, one DDP model, its comm hook changed every "
                         f"step ({r['rounds']} rounds):")
            for name, h in r["hooks"].items():
                lines.append(f"#   {name}: {h['ms']:.2f} ms, {h['over_default_ms']:+.3f} ms "
                             f"per step over the default")
    return lines


def amp_overhead_lines(results: list[dict]) -> list[str]:
    """AMP overhead per DDP step: amp rows minus the plain DDP row (overlap off), same n."""
    lines = []
    for res in results:
        rows = res["rows"]
        for model in ("small", "large"):
            base = next((r for r in rows if r["model"] == model and r["ddp"] and
                         r.get("overlap") is False and "amp" not in r and
                         "bucket_cap_mb" not in r), None)
            for mode in ("scaler", "autocast"):
                r = next((r for r in rows if r["model"] == model and r.get("amp") == mode),
                         None)
                if base is None or r is None:
                    continue
                extra = r["step_ms"] - base["step_ms"]
                lines.append(f"# n={res['world_size']} {model}: amp={mode} adds {extra:+.2f} ms "
                             f"per DDP step ({extra / base['step_ms'] * 100:+.1f}%)")
        if "fused_unscale_ms_1.86M" in res:
            lines.append(f"# n={res['world_size']}: fused unscale of a 1.86M-float bucket "
                         f"({res['kernels']}): {res['fused_unscale_ms_1.86M']:.2f} ms, replacing "
                         f"the {res['finite_check_ms_1.86M']:.2f} ms finiteness check")
    return lines


def driver(args: argparse.Namespace) -> None:
    results = []
    for n in args.sizes:
        out = Path(args.out) / f".ddp_scaling_n{n}.tmp.json"
        cmd = [mpiexec_path(), "-n", str(n), sys.executable,
               __file__, "--worker-out", str(out), "--steps", str(args.steps),
               "--warmup", str(args.warmup), "--rounds", str(args.rounds), "--out", args.out,
               "--models", *args.models, "--paired", str(args.paired)] \
            + (["--quick"] if args.quick else []) \
            + (["--hooks", str(args.hooks)] if args.hooks else []) \
            + (["--amp"] if args.amp else []) + (["--trace", args.trace] if args.trace else [])
        print(f"# running n={n}: {' '.join(cmd[:3])} ...", flush=True)
        subprocess.run(cmd, check=True, env=one_thread_env(), timeout=600)
        results.append(json.loads(out.read_text()))
        out.unlink()
    text = table(results)
    print(text)
    meta = {"command": " ".join(["python benchmarks/ddp_scaling.py", *sys.argv[1:]]),
            "machine": f"{platform.machine()} {os.cpu_count()} cpus, {platform.python_version()}",
            "batch_per_rank": BATCH, "steps_per_round": args.steps, "rounds": args.rounds,
            "results": results}
    res_dir, stem = Path(args.out), result_stem(args)
    (res_dir / f"{stem}.json").write_text(json.dumps(meta, indent=2))
    (res_dir / f"{stem}.txt").write_text(f"# {meta['command']}  ({meta['machine']})\n"
                                         + text + "\n")
    print(f"# wrote {shown(res_dir / (stem + '.json'))} and {stem}.txt")


def result_stem(args: argparse.Namespace) -> str:
    """``ddp_scaling``, ``ddp_scaling_amp`` for --amp runs, ``..._trace`` for --trace runs
    (each keeps the others' tables: a traced step is slower, not for the table)."""
    return ("ddp_scaling_amp" if args.amp else "ddp_scaling") + ("_trace" if args.trace else "")


def main() -> None:
    p = Parser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--steps", type=int, default=15, help="timed steps per round")
    p.add_argument("--rounds", type=int, default=3, help="round-robin passes over the configs")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="skip the bucket-size sweep")
    p.add_argument("--paired", type=int, default=0, metavar="PAIRS",
                   help="also time PAIRS alternating plain/DDP steps per model (see "
                   "paired_steps): DDP's overhead, robust to load from other jobs")
    p.add_argument("--hooks", type=int, default=0, metavar="ROUNDS",
                   help="also time ROUNDS rounds of one DDP model whose comm hook changes "
                   "every step (see hook_steps): what the default averaging costs beside "
                   "hooks.prescaled_allreduce_hook and hooks.allreduce_hook")
    p.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["small", "large"],
                   help="which models to run (large: the reference workload of the targets)")
    p.add_argument("--amp", action="store_true",
                   help="add AMP rows (GradScaler alone; autocast + GradScaler)")
    p.add_argument("--out", default=str(LOCAL_RESULTS), help="folder for the JSON/text "
                   "results (the published ones: --out benchmarks/results)")
    p.add_argument("--trace", metavar="DIR", help="write a step timeline per world size "
                   "into DIR/n<N>/ (Chrome trace / Perfetto JSON; see minidist/tracing.py)")
    p.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = p.parse_args()
    for flag, values, least in (("--sizes", args.sizes, 1), ("--steps", [args.steps], 1),
                                ("--rounds", [args.rounds], 1), ("--warmup", [args.warmup], 0),
                                ("--paired", [args.paired], 0), ("--hooks", [args.hooks], 0)):
        if min(values) < least:
            usage_error(f"{flag} must be >= {least}, got {min(values)}")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    launched = comm.detect_launch().launcher != "single"
    if args.worker_out or launched:
        res = worker(args)
        if res is not None and comm_rank_is_zero(res):
            if args.worker_out:
                Path(args.worker_out).write_text(json.dumps(res))
            else:
                print(table([res]))
                path = Path(args.out) / f"{result_stem(args)}_n{res['world_size']}.json"
                path.write_text(json.dumps(res, indent=2))
                print(f"# wrote {shown(path)}")
    else:
        driver(args)


def comm_rank_is_zero(res: dict) -> bool:
    return res.get("_rank", 0) == 0


if __name__ == "__main__":
    main()
