"""DDP with the model on DEVICE (argv[1]: "cuda", or "cpu" for the CPU twin) equals the same
training on the host, to float rounding, on every rank.

    mpiexec -n 2 python tests/cuda/ddp_device_rank.py cuda    # both ranks on GPU 0

A few SGD steps with momentum on a small MLP, DDP over the MPI transport: on a GPU the buckets
are CuPy arrays, reduced by "auto" (cuda_ipc: the ranks share a node), by "ring" (staged
through pinned host buffers: the PyPI MPI is not CUDA-aware) and by "cuda_ipc" named; on the
CPU the buckets go through "ipc_host" (cuda_ipc's protocol on host windows) instead.
"""

import sys

import numpy as np

import minidist
from minidist import comm, nn, optim
from minidist.ddp import DistributedDataParallel
from minidist.tensor import Tensor

device = sys.argv[1] if len(sys.argv) > 1 else "cpu"
comm.init_process_group(backend="mpi")
rank, world = comm.get_rank(), comm.get_world_size()


def train(where, algorithm="auto"):
    nn.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 5)).to(where)
    overlap = True if "ipc" in algorithm else "auto"  # buckets reduced during backward
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.01, first_bucket_cap_mb=0.005,
                                  algorithm=algorithm, overlap=overlap)
    opt = optim.SGD(model.parameters(), lr=0.05, momentum=0.9, fused=True)
    rng = np.random.default_rng(rank)
    for _ in range(4):
        x = rng.standard_normal((8, 20)).astype(np.float32)
        y = rng.integers(0, 5, 8)
        xt, yt = Tensor(minidist.xp.move(x, where)), Tensor(minidist.xp.move(y, where))
        opt.zero_grad()
        nn.CrossEntropyLoss()(ddp(xt), yt).backward()
        opt.step()
    ddp.close()
    return [minidist.xp.to_host(p.array) for p in model.parameters()]


host = train("cpu")
# "cuda_ipc" on a GPU; its CPU twin "ipc_host" runs the same protocol, plans and flags on host
# windows in MPI shared memory, so the CPU run checks the path DDP's device buckets take.
for algorithm in ("auto", "ring", "cuda_ipc" if device == "cuda" else "ipc_host"):
    dev = train(device, algorithm)
    for a, b in zip(host, dev):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    gathered = np.zeros(world, np.float64)
    gathered[rank] = float(sum(np.abs(b).sum() for b in dev))
    comm.all_reduce(gathered)
    assert np.all(gathered == gathered[0]), gathered  # every rank holds the same parameters
print(f"[rank {rank}] ddp device == host ok ({device})", flush=True)
comm.destroy_process_group()
