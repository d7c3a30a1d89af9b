"""DistributedDataParallel.join() on uneven inputs (rank body); rank 0 prints ``RESULT {...}``.

    ./mpirun.sh -n 3 python tests/ddp/join_rank.py       # tests/ddp/test_join_mpi.py

Rank r has 3 + r batches (3, 4, 5 at n=3). Inside ``with ddp.join():`` the ranks that run out
shadow the others' collectives; every rank must finish (no hang) with bit-identical parameters
equal to one process that, at step s, trains on the concatenated batches of the ranks that
still have one (their number divides the summed gradients). Float64, so only the summation
order differs: rtol=atol=1e-10. Run with overlap on and off; then with a BatchNorm layer and
broadcast_buffers=True (the shadow step broadcasts buffers too): parameters and buffers
identical on every rank (no single-process oracle there: BatchNorm normalizes per rank).
Last, ``join(divide_by_initial_world_size=True)``: every step divided by the world size.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np

from minidist import comm, nn
from minidist.ddp import DistributedDataParallel
from minidist.nn.module import Module, Parameter
from minidist.optim import SGD
from minidist.tensor import Tensor

B, D_IN, D_H, D_OUT = 4, 6, 8, 3


class Net(Module):
    def __init__(self, bn: bool) -> None:
        super().__init__()
        rng = np.random.default_rng(0)
        self.w1 = Parameter(rng.normal(size=(D_IN, D_H)) / 3)
        self.w2 = Parameter(rng.normal(size=(D_H, D_OUT)) / 3)
        self.b2 = Parameter(np.zeros(D_OUT))
        self.bn = nn.BatchNorm1d(D_H, affine=False) if bn else None

    def forward(self, x):
        h = x @ self.w1
        if self.bn is not None:
            h = self.bn(h)
        return h.tanh() @ self.w2 + self.b2


def loss_fn(out, y):
    return ((out - Tensor(y)) ** 2).mean()


def batches(world: int):
    rng = np.random.default_rng(1)
    n_max = 3 + world - 1
    return rng.normal(size=(world, n_max, B, D_IN)), rng.normal(size=(world, n_max, B, D_OUT))


def reference(world: int, bn: bool, initial: bool = False) -> Net:
    """One process: at step s, the batches of every rank that still has one, concatenated
    (``initial``: the summed gradients divided by the world size, not by the active ranks)."""
    xs, ys = batches(world)
    model = Net(bn)
    opt = SGD(list(model.parameters()), lr=0.1)
    for s in range(3 + world - 1):
        active = [r for r in range(world) if s < 3 + r]
        x = np.concatenate([xs[r, s] for r in active])
        y = np.concatenate([ys[r, s] for r in active])
        loss = loss_fn(model(Tensor(x)), y)
        (loss * (len(active) / world) if initial else loss).backward()
        opt.step()
        opt.zero_grad()
    return model


def train(rank: int, world: int, bn: bool, overlap: bool, initial: bool = False) -> Net:
    xs, ys = batches(world)
    model = Net(bn)
    ddp = DistributedDataParallel(model, overlap=overlap, broadcast_buffers=bn)
    opt = SGD(list(model.parameters()), lr=0.1)
    with ddp.join(divide_by_initial_world_size=initial):
        for s in range(3 + rank):
            loss_fn(ddp(Tensor(xs[rank, s])), ys[rank, s]).backward()
            opt.step()
            opt.zero_grad()
    ddp.close()
    return model


def digest(model) -> str:
    h = hashlib.sha256()
    for _, a in model.state_dict().items():
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def main() -> None:
    comm.init_process_group()
    rank, world = comm.get_rank(), comm.get_world_size()
    result = {"world_size": world}
    for bn in (False, True):
        for overlap in (False, True):
            model = train(rank, world, bn, overlap)
            ref = reference(world, bn)
            close = bn or all(np.allclose(p.array, q.array, rtol=1e-10, atol=1e-10)
                        for p, q in zip(model.parameters(), ref.parameters()))
            digests = comm.all_gather_object(digest(model))
            result[f"bn={bn}/overlap={overlap}"] = {
                "identical": len(set(digests)) == 1, "close": close}
    # divided by the world size: the default hook's all-reduce AVG, shadowed by the same calls
    model, ref = train(rank, world, False, False, initial=True), reference(world, False, True)
    result["divide_by_initial_world_size"] = {
        "identical": len(set(comm.all_gather_object(digest(model)))) == 1,
        "close": all(np.allclose(p.array, q.array, rtol=1e-10, atol=1e-10)
                     for p, q in zip(model.parameters(), ref.parameters()))}
    if rank == 0:
        print("RESULT " + json.dumps(result), flush=True)
    comm.destroy_process_group()


if __name__ == "__main__":
    main()
