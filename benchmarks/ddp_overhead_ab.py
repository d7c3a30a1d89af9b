"""DDP's overhead, this checkout against an older commit, alternated in one window.

    .venv/bin/python benchmarks/ddp_overhead_ab.py --old v1.0           # 4 rounds, n=2
    .venv/bin/python benchmarks/ddp_overhead_ab.py --old HEAD~20 --rounds 6 --momentum 0.9

Did a change make DDP slower? On a machine shared with other jobs, two runs of the same code
differ by more than most changes do, so one run per side decides nothing. This script runs
the old and the new code one after the other, ``--rounds`` times each, the order flipping every
round, and compares them round by round::

    round 1:  old job, new job        each job: n ranks, one plain model and one DDP(model)
    round 2:  new job, old job                   of the same processes, taking turns
    round 3:  old job, new job        result:    the median over the rounds, per side, of
    ...                                          the job's DDP step / plain step

A job measures as ``ddp_scaling.py --paired`` does: the 784-1024-1024-10 MLP (batch 64 per
rank, SGD), its steps inside a ``DataLoader`` pass as in a training loop; each round of a job
takes two steps per side and times the second (a step right after the other model's finds its
weights out of cache); an untimed barrier starts each timed step; a step counts at its slowest
rank; the job's ratio is the median of its per-round ratios. The job uses only the public API (``nn``, ``optim``, ``DistributedDataParallel``), so
any commit with DDP runs it.

The old code is ``git archive <rev> minidist`` unpacked into a temporary folder; its jobs
import minidist from there (the venv's editable install of this checkout is set aside for
them). The new code is this working tree, uncommitted changes included.

Output: a table on stdout, ``ddp_overhead_ab.json`` and ``.txt`` in ``--out`` (default
runs/bench/, git-ignored).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import LOCAL_RESULTS, ab_entry, alternate, run_ab_job, write_ab  # noqa: E402

LAYERS = (784, 1024, 1024, 10)
BATCH = 64


def job(pairs: int, warmup: int, momentum: float) -> dict[str, Any] | None:
    """One side's measurement (every rank runs it; rank 0 returns the result)."""
    import numpy as np

    import minidist
    from minidist import comm, nn, optim
    from minidist.ddp import DistributedDataParallel
    from minidist.tensor import Tensor

    comm.init_process_group()
    # the steps run inside a sharded DataLoader's pass, as a training loop's do (what DDP
    # does per step may depend on it: the watch wing labels each step's buckets with the batch)
    from minidist.data import ArrayDataset, DataLoader, DistributedSampler
    rows = 4 * comm.get_world_size()
    data = ArrayDataset(np.zeros((rows, 1), np.float32), np.zeros(rows, np.int64))
    batches = iter(DataLoader(data, batch_size=1, sampler=DistributedSampler(data)))
    next(batches)
    rng = np.random.default_rng(comm.get_rank())
    x = Tensor(rng.normal(size=(BATCH, LAYERS[0])).astype(np.float32))
    y = rng.integers(0, LAYERS[-1], BATCH)
    loss_fn = nn.CrossEntropyLoss()
    sides = []
    for use_ddp in (False, True):
        minidist.manual_seed(0)
        layers: list[Any] = []
        for d_in, d_out in zip(LAYERS, LAYERS[1:]):
            layers += [nn.Linear(d_in, d_out), nn.ReLU()]
        model = nn.Sequential(*layers[:-1])
        net = DistributedDataParallel(model) if use_ddp else model
        sides.append((net, optim.SGD(model.parameters(), lr=0.01, momentum=momentum)))

    def step(side: int) -> float:
        net, opt = sides[side]
        comm.barrier()  # untimed: the ranks start each timed step together
        t0 = time.perf_counter()
        loss_fn(net(x), y).backward()
        opt.step()
        opt.zero_grad()
        return time.perf_counter() - t0

    times: list[list[float]] = [[], []]
    for i in range(warmup + pairs):
        for j in range(2):  # the order rotates
            side = (i + j) % 2
            step(side)  # untimed: the timed step finds its model in cache
            t = step(side)
            if i >= warmup:
                times[side].append(t)
    slowest = np.array(times, dtype=np.float64)
    comm.all_reduce(slowest, op="max")  # each step at its slowest rank
    rank = comm.get_rank()
    comm.destroy_process_group()
    if rank != 0:
        return None
    return {"minidist": str(Path(minidist.__file__).resolve().parent.parent),
            "plain_ms": float(np.median(slowest[0])) * 1e3,
            "ddp_ms": float(np.median(slowest[1])) * 1e3,
            "ratio": float(np.median(slowest[1] / slowest[0]))}


def run_side(args: argparse.Namespace, library: Path | None, out: Path) -> dict[str, Any]:
    return run_ab_job("ddp_overhead_ab", __file__, args.n, [
        "--pairs", str(args.pairs), "--warmup", str(args.warmup),
        "--momentum", str(args.momentum)], library, out, args.timeout)


def table(rounds: list[dict[str, Any]], old: str) -> str:
    lines = [f"# DDP step / plain step at n={rounds[0]['n']}: old = {old[:10]}, new = this "
             "checkout",
             "# round  first  old plain ms  old DDP ms  old ratio  new plain ms  new DDP ms  "
             "new ratio"]
    for r in rounds:
        o, n = r["old"], r["new"]
        lines.append(f"  {r['round']:5d}  {r['first']:>5}  {o['plain_ms']:12.2f}  "
                     f"{o['ddp_ms']:10.2f}  {o['ratio']:9.3f}x {n['plain_ms']:12.2f}  "
                     f"{n['ddp_ms']:10.2f}  {n['ratio']:9.3f}x")
    med = {s: statistics.median(r[s]["ratio"] for r in rounds) for s in ("old", "new")}
    lines.append(f"# median ratio: old {med['old']:.3f}x, new {med['new']:.3f}x; "
                 f"new / old = {med['new'] / med['old']:.3f}")
    return "\n".join(lines)


def driver(args: argparse.Namespace) -> None:
    old, rounds = alternate("ddp_overhead_ab", args.old, args.rounds, Path(args.out),
                            lambda library, out: run_side(args, library, out), {"n": args.n})
    write_ab("ddp_overhead_ab", Path(args.out), old, rounds, table(rounds, old))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--old", help="the commit to compare with (id, tag, branch); required")
    p.add_argument("--rounds", type=int, default=4, help="jobs per side, alternated")
    p.add_argument("--pairs", type=int, default=150, help="timed rounds per job")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("-n", type=int, default=2, help="ranks per job")
    p.add_argument("--momentum", type=float, default=0.0, help="SGD momentum (default: none, "
                   "as ddp_scaling.py)")
    p.add_argument("--timeout", type=float, default=600, help="seconds per job")
    p.add_argument("--out", default=str(LOCAL_RESULTS), help="folder for the JSON/text results")
    p.add_argument("--job-out", help=argparse.SUPPRESS)
    p.add_argument("--library", help=argparse.SUPPRESS)
    args = p.parse_args()
    ab_entry(p, args, lambda: job(args.pairs, args.warmup, args.momentum), driver)


if __name__ == "__main__":
    main()
