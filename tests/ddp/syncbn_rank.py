"""SyncBatchNorm under mpiexec (rank body); rank 0 prints ``RESULT {...}``.

    ./mpirun.sh -n 2 python tests/ddp/syncbn_rank.py    # tests/ddp/test_syncbn_mpi.py

Every rank builds the same full batch. (1) A BatchNorm on the full batch is the reference; a
SyncBatchNorm converted from an identical BatchNorm runs on this rank's slice: outputs, input
gradients, running statistics must equal the reference's slice, and the weight/bias gradients
summed over the ranks the reference's. (2) DDP over a conv net converted with
convert_sync_batchnorm, trained on the slices with a mean loss, must follow the same net
trained on the full batch in one process (step for step, float64).
"""

from __future__ import annotations

import json

import numpy as np

import minidist
from minidist import Tensor, comm, nn
from minidist.ddp import DistributedDataParallel
from minidist.optim import SGD


def max_err(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


def layer_check(bn_cls, shape, rank, world) -> dict:
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape) * 3 + 1
    r = rng.standard_normal(shape)
    n = shape[0] // world
    rows = slice(rank * n, (rank + 1) * n)
    minidist.manual_seed(0)
    ref = bn_cls(shape[1]).double()
    ref.weight.array[...] = rng.uniform(0.5, 1.5, shape[1])
    ref.bias.array[...] = rng.standard_normal(shape[1])
    sync = nn.SyncBatchNorm.convert_sync_batchnorm(bn_cls(shape[1]).double())
    sync.load_state_dict(ref.state_dict())
    xr, xs = Tensor(x, requires_grad=True), Tensor(x[rows], requires_grad=True)
    yr, ys = ref(xr), sync(xs)
    (yr * Tensor(r)).sum().backward()
    (ys * Tensor(r[rows])).sum().backward()
    wsum, bsum = comm.all_reduce(sync.weight.grad.array.copy()), comm.all_reduce(sync.bias.grad.array.copy())
    return {"type": type(sync).__name__,
            "out": max_err(ys.array, yr.array[rows]), "grad_x": max_err(xs.grad, xr.grad[rows]),
            "grad_w": max_err(wsum, ref.weight.grad), "grad_b": max_err(bsum, ref.bias.grad),
            "running_mean": max_err(sync.running_mean.array, ref.running_mean.array),
            "running_var": max_err(sync.running_var.array, ref.running_var.array)}


def net():
    minidist.manual_seed(0)
    return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.Flatten(), nn.Linear(4 * 5 * 5, 3)).double()


def ddp_check(rank, world) -> dict:
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((8, 2, 5, 5)), rng.integers(0, 3, 8)
    n = 8 // world
    rows = slice(rank * n, (rank + 1) * n)
    ref = net()
    ref_opt = SGD(ref.parameters(), lr=0.1)
    model = nn.SyncBatchNorm.convert_sync_batchnorm(net())
    try:
        DistributedDataParallel(model, overlap=True)
        refused = False
    except ValueError as e:
        refused = "SyncBatchNorm" in str(e)
    ddp = DistributedDataParallel(model)
    opt = SGD(ddp.parameters(), lr=0.1)
    for _ in range(3):
        for m, o, xb, yb in ((ref, ref_opt, x, y), (ddp, opt, x[rows], y[rows])):
            o.zero_grad()
            nn.CrossEntropyLoss()(m(xb), yb).backward()
            o.step()
    ddp.close()
    err = max(max_err(a, b) for a, b in zip(model.state_dict().values(),
                                            ref.state_dict().values()))
    return {"overlap_refused": refused, "overlap": ddp.overlap, "state_err": err}


def main() -> None:
    minidist.init_process_group()
    rank, world = comm.get_rank(), comm.get_world_size()
    res = {"bn1d": layer_check(nn.BatchNorm1d, (8, 5), rank, world),
           "bn1d_3d": layer_check(nn.BatchNorm1d, (4, 3, 6), rank, world),
           "bn2d": layer_check(nn.BatchNorm2d, (4, 3, 4, 5), rank, world),
           "ddp": ddp_check(rank, world)}
    worst = comm.all_gather_object(res)
    if rank == 0:
        print("RESULT " + json.dumps(worst), flush=True)
    minidist.destroy_process_group()


if __name__ == "__main__":
    main()
