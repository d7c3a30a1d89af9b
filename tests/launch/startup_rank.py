"""A rank that starts a process group, all-reduces once and ends (tests/watch/test_startup_errors.py)."""

import numpy as np

import minidist as md

md.init_process_group()
x = np.ones(4)
md.all_reduce(x)
print(f"rank {md.get_rank()} sum {x[0]:g}", flush=True)
md.destroy_process_group()
