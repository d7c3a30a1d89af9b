"""Rank body: the usual `if rank == 0: minidist.save(...)` then a barrier, then every rank loads."""

import sys

import numpy as np

import minidist
from minidist import nn

path = sys.argv[1]
minidist.init_process_group()
rank = minidist.get_rank()
nn.manual_seed(0)
model = nn.Linear(3, 2)
if rank == 0:
    minidist.save({"model": model.state_dict(), "epoch": 1}, path)
minidist.barrier()
state = minidist.load(path)
assert state["epoch"] == 1
for k, v in model.state_dict().items():
    np.testing.assert_array_equal(state["model"][k], v)
print(f"[rank {rank}] loaded ok", flush=True)
minidist.destroy_process_group()
