"""The NaN/inf check folded into the shared-memory all-reduce (rank body); rank 0 prints
``RESULT {...}`` (tests/fastpath/test_shm_nonfinite_mpi.py).

1. a buffer in a shared window, reduced with algorithm "shm" (the in-place path): each rank
   checks the slice it finishes; a NaN, or an inf, that only one rank's slice holds is seen by
   every rank (``group.shared_memory.reduced_finite``); huge finite values are finite (True)
   with the one-pass kernel, "maybe" (False) with NumPy's pieces (MINIDIST_KERNELS=reference);
   the copy path, or a later shared-memory reduction of another buffer, leaves none (None)
2. DDP with buckets large enough for "shm": the NaN/inf check makes no pass of its own over the
   buckets (``all_finite_fast`` is never called), and a NaN on the last rank raises the same
   error as before, naming the parameters and the rank where it started
"""

import json

import numpy as np

import minidist as md
import minidist.watch.nonfinite as nonfinite
from minidist import nn
from minidist.comm import get_default_group

md.init_process_group()
rank, n = md.get_rank(), md.get_world_size()
group = get_default_group()
shared = group.shared_memory
res: dict = {"n": n, "has_shm": shared is not None}

# 1. the verdicts of the in-place path
numel = 1 << 16
buf = shared.alloc_buffer(numel, np.float32)
verdicts = {}
for case, value in [("clean", 1.0), ("nan", np.nan), ("inf", np.inf), ("huge", 1e30)]:
    buf[...] = 1.0
    if rank == 0 and case != "clean":
        buf[-1] = value  # the last slice: the last rank reduces it, not rank 0
    group.all_reduce(buf, "avg", algorithm="shm")
    verdicts[case] = shared.reduced_finite(buf)
verdicts["handed_out_once"] = shared.reduced_finite(buf)
plain = np.ones(numel, np.float32)
group.all_reduce(plain, "avg", algorithm="shm")  # not in a window: the copy path
verdicts["copy_path"] = shared.reduced_finite(plain)
buf[...] = 1.0
group.all_reduce(buf, "avg", algorithm="shm")
group.all_reduce(plain, "avg", algorithm="shm")  # the last shm reduction was not of buf
verdicts["after_another"] = shared.reduced_finite(buf)
res["verdicts"] = verdicts
shared.free_buffer(buf)

# 2. DDP: no separate pass, the same error
passes = []
real = nonfinite.all_finite_fast
nonfinite.all_finite_fast = lambda b: passes.append(b.size) or real(b)
nn.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 2048), nn.ReLU(), nn.Linear(2048, 10))
ddp = md.DistributedDataParallel(model, nonfinite_grads="raise")
loss_fn = nn.CrossEntropyLoss()
x = np.random.default_rng(rank).standard_normal((16, 64)).astype(np.float32)
y = np.arange(16) % 10
for _ in range(3):
    ddp.zero_grad()
    loss_fn(ddp(md.Tensor(x)), y).backward()
res["ddp_algorithms"] = sorted({group.plan_all_reduce(b.buffer, b.algorithm, "avg").algorithm
                                for b in ddp.reducer.buckets})
res["ddp_separate_passes"] = len(passes)
res["ddp_clean_finite"] = [b.finite for b in ddp.reducer.buckets]
if rank == n - 1:
    x[0, 0] = np.nan
try:
    ddp.zero_grad()
    loss_fn(ddp(md.Tensor(x)), y).backward()
    res["ddp_nan_error"] = None
except FloatingPointError as e:
    res["ddp_nan_error"] = str(e)
ddp.close()

rows = group.all_gather_object(res)
if rank == 0:
    print("RESULT " + json.dumps(rows), flush=True)
md.destroy_process_group()
