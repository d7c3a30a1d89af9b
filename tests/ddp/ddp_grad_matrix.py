"""DDP's averaged gradients against one process, case by case: the body of the gradient matrix.

    got = run_block(block, group, rank, world)      # on every rank (thread ranks or mpiexec)
    problems = check_block(block, {rank: got}, world)   # [] when every case matches the oracle

One case is a layout of the buckets x ``find_unused_parameters`` x overlap x how gradients
accumulate (one synced step; a ``no_sync`` micro-step first; a micro-step with
``require_backward_grad_sync = False`` first) x what the user assigns to ``p.grad`` (nothing;
an array before the first forward; an array between the last forward and its backward).

The oracle runs the same schedule on a plain model in ONE process, without DDP, once per
rank's shard (the same forward, the same assignments, the same backward calls), and averages
the ranks' gradients with NumPy. At two ranks that average is one addition and one exact
halving, whatever order an all-reduce adds in, so DDP must match it BIT FOR BIT. Each case
also checks the buckets' launch order (0, 1, 2, ... on every rank), that one synced backward
ran, and, after an unsynced micro-step, that every rank holds its own local gradient (nothing
was averaged yet). Where no gradient is assigned and every rank runs the same forward, the
gradients are compared with one process on the full batch too (rtol 1e-12, float64: only
the summation order differs).

Layouts (parameters w0 b0 [unused] w1 b1 w2 b2; buckets are planned from the last one)::

    one           one bucket
    per_param     a bucket per parameter
    two           two buckets split inside layer 1 (bucket 0: b2 w2 b1 w1)
    out_of_order  as two, but the forward runs layer 2 first: bucket 1 is READY before
                  bucket 0 and must wait for it
    rank_order    a bucket per layer, and each rank runs the layers in ANOTHER order, so the
                  ranks fill the buckets in different orders (the launch order must not)
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from minidist.ddp import DistributedDataParallel
from minidist.ddp.observers import ReducerObserver
from minidist.nn.module import Module, Parameter
from minidist.tensor import Tensor

D, B = 5, 3                     # width, rows per rank and micro-step
LAYER_BYTES = (D * D + D) * 8   # one float64 layer: weight + bias
LAYOUTS = ("one", "per_param", "two", "out_of_order", "rank_order")
ACCUMS = ("none", "no_sync", "flag")
USERS = ("none", "before", "between")
ASSIGNED = ("w1", "b0")         # the parameters the user gives a gradient (two buckets)
FULL_BATCH_TOL = dict(rtol=1e-12, atol=1e-15)


@dataclass(frozen=True)
class Block:
    """Cases that share a layout, find_unused_parameters and overlap (one thread-rank run)."""

    layout: str
    find_unused: bool
    overlap: bool

    @property
    def id(self) -> str:
        return f"{self.layout}-{'unused' if self.find_unused else 'all_used'}-" \
               f"{'overlap' if self.overlap else 'at_end'}"


BLOCKS = [Block(lay, fu, ov) for lay, fu, ov in
          itertools.product(LAYOUTS, (False, True), (True, False))]
SUBCASES = list(itertools.product(ACCUMS, USERS))
MPI_BLOCKS = [b for b in BLOCKS if b.layout in ("two", "out_of_order", "rank_order")]


def forward_order(layout: str, rank: int) -> list[int]:
    if layout == "out_of_order":
        return [2, 0, 1]
    if layout == "rank_order":
        return [[0, 1, 2], [2, 0, 1], [1, 2, 0]][rank % 3]
    return [0, 1, 2]


def bucket_caps(layout: str) -> dict:
    mb = 1 / (1 << 20)
    if layout == "per_param":
        return dict(bucket_cap_mb=mb, first_bucket_cap_mb=mb)
    if layout in ("two", "out_of_order"):
        return dict(bucket_cap_mb=25, first_bucket_cap_mb=1.5 * LAYER_BYTES * mb)
    if layout == "rank_order":
        return dict(bucket_cap_mb=LAYER_BYTES * mb, first_bucket_cap_mb=LAYER_BYTES * mb)
    return {}


class Net(Module):
    """Three tanh layers D -> D run in ``order``; ``unused`` (if any) is never used."""

    def __init__(self, order: list[int], unused: bool) -> None:
        super().__init__()
        rng = np.random.default_rng(0)
        self.order = order
        for k in range(3):
            setattr(self, f"w{k}", Parameter(rng.normal(size=(D, D)) / 2))
            setattr(self, f"b{k}", Parameter(rng.normal(size=D) / 4))
            if k == 0 and unused:  # registration order: w0 b0 unused w1 b1 w2 b2
                self.unused = Parameter(rng.normal(size=D))

    def forward(self, x):
        for k in self.order:
            x = (x @ getattr(self, f"w{k}") + getattr(self, f"b{k}")).tanh()
        return x


def data(micro: int, world: int):
    """(x, y) of each micro-step for the whole world: micro x (world*B) rows."""
    rng = np.random.default_rng(1)
    return rng.normal(size=(micro, world * B, D)), rng.normal(size=(micro, world * B, D))


def user_grad(name: str, shape: tuple, rank: int) -> np.ndarray:
    return np.random.default_rng(100 + 10 * rank + ASSIGNED.index(name)).normal(size=shape)


def loss_fn(out, y, micro: int):
    return ((out - Tensor(y)) ** 2).mean() / micro


def grads(model) -> dict:
    return {n: None if p.grad is None else np.array(p.grad.array, copy=True)
            for n, p in model.named_parameters()}


class LaunchOrder(ReducerObserver):
    def __init__(self) -> None:
        self.order: list[int] = []

    def bucket_ready(self, bucket) -> None:
        self.order.append(bucket.index)


def schedule(model, wrapped, accum: str, user: str, rank: int, world: int, ddp=None) -> dict:
    """Run one step (its micro-steps) on ``wrapped`` (the DDP or the plain model); return the
    gradients after the first micro-step (when there are two) and at the end."""
    micro = 1 if accum == "none" else 2
    xs, ys = data(micro, world)
    params = dict(model.named_parameters())
    out: dict = {}

    def assign() -> None:
        for n in ASSIGNED:
            params[n].grad = user_grad(n, params[n].array.shape, rank)

    if user == "before":
        assign()
    for m in range(micro):
        rows = slice(rank * B, (rank + 1) * B)
        x, y = Tensor(xs[m, rows]), ys[m, rows]
        last = m == micro - 1
        if ddp is not None and accum == "flag":
            ddp.require_backward_grad_sync = last
        if ddp is not None and accum == "no_sync" and not last:
            with ddp.no_sync():
                loss_fn(wrapped(x), y, micro).backward()
        else:
            loss = loss_fn(wrapped(x), y, micro)
            if user == "between" and last:
                assign()
            loss.backward()
        if not last:
            out["local"] = grads(model)
    out["final"] = grads(model)
    return out


def run_block(block: Block, group, rank: int, world: int) -> dict:
    """Every sub-case of ``block`` with DDP on this rank: {sub-case: gradients and launches}."""
    res = {}
    for accum, user in SUBCASES:
        model = Net(forward_order(block.layout, rank), block.find_unused)
        ddp = DistributedDataParallel(model, process_group=group, overlap=block.overlap,
                                      find_unused_parameters=block.find_unused,
                                      nonfinite_grads="raise", **bucket_caps(block.layout))
        launches = LaunchOrder()
        ddp.reducer.add_observer(launches)
        syncs = ddp.reducer.num_syncs
        got = schedule(model, ddp, accum, user, rank, world, ddp)
        got["launches"] = launches.order
        got["buckets"] = len(ddp.buckets)
        got["syncs"] = ddp.reducer.num_syncs - syncs
        ddp.close()
        res[f"{accum}/{user}"] = got
    return res


def reference(block: Block, accum: str, user: str, world: int) -> dict:
    """The oracle: each rank's schedule on a plain model in this process, averaged."""
    runs = []
    for r in range(world):
        model = Net(forward_order(block.layout, r), block.find_unused)
        runs.append(schedule(model, model, accum, user, r, world))
    final = {}
    for n in runs[0]["final"]:
        per_rank = [np.zeros((D, D) if n[0] == "w" else D) if run["final"][n] is None
                    else run["final"][n] for run in runs]
        final[n] = sum(per_rank[1:], per_rank[0]) / world
    return {"final": final, "local": [run.get("local") for run in runs]}


def full_batch(block: Block, accum: str) -> dict:
    """One process, the whole global batch (the same loss, no user gradients)."""
    micro = 1 if accum == "none" else 2
    model = Net(forward_order(block.layout, 0), block.find_unused)
    world = 2
    xs, ys = data(micro, world)
    for m in range(micro):
        loss_fn(model(Tensor(xs[m])), ys[m], micro).backward()
    return grads(model)


def _equal(a, b) -> bool:
    return a is not None and b is not None and a.shape == b.shape and np.array_equal(a, b)


def check_block(block: Block, got_by_rank: dict, world: int) -> list[str]:
    """What differs from the oracle, one line per problem (empty: every case matches).

    ``got_by_rank``: ``{rank: run_block's result}`` for some or all of the ranks."""
    problems = []
    for accum, user in SUBCASES:
        key = f"{accum}/{user}"
        want = reference(block, accum, user, world)
        same_order = block.layout != "rank_order"
        for r, got_all in got_by_rank.items():
            got = got_all[key]
            where = f"{block.id} {key} rank {r}"
            if got["syncs"] != 1:
                problems.append(f"{where}: {got['syncs']} synced backward passes, expected 1")
            if got["launches"] != list(range(got["buckets"])):
                problems.append(f"{where}: buckets launched in order {got['launches']}")
            for n, w in want["final"].items():
                g = got["final"][n]
                if g is None and n == "unused" and not np.any(w):
                    continue
                if not _equal(g, w):
                    err = "None" if g is None else f"max |diff| {np.max(np.abs(g - w)):.3g}"
                    problems.append(f"{where}: {n}.grad is not the average of the ranks' "
                                    f"gradients ({err})")
            if accum != "none":  # the unsynced micro-step left each rank its own gradient
                for n, w in want["local"][r].items():
                    g = got["local"][n]
                    if w is None and (g is None or not np.any(g)):
                        continue
                    if not _equal(g, w):
                        problems.append(f"{where}: after the unsynced micro-step {n}.grad is "
                                        "not this rank's local gradient")
        if user == "none" and same_order and world == 2:
            ref = full_batch(block, accum)
            for n, w in ref.items():
                g = next(iter(got_by_rank.values()))[key]["final"][n]
                w = np.zeros_like(g) if w is None else w
                if not np.allclose(g, w, **FULL_BATCH_TOL):
                    problems.append(f"{block.id} {key}: {n}.grad differs from one process on "
                                    f"the full batch by {np.max(np.abs(g - w)):.3g}")
    return problems
