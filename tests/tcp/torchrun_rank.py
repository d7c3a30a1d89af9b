"""Rank body for test_tcp.py: init_process_group() from torchrun-style variables, one all-reduce."""

import numpy as np

import minidist as md

md.init_process_group()
x = np.full(4, md.get_rank() + 1, np.float32)
md.all_reduce(x)
print(f"OK torchrun rank {md.get_rank()} sum {x[0]:g}", flush=True)
md.destroy_process_group()
