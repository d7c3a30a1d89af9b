"""Rank 1 raises after one all-reduce; argv[1] "0" sets end_job_on_error=False on every rank
(tests/watch/test_failure_policy.py)."""

import sys

import numpy as np

import minidist as md

md.init_process_group()
md.comm.get_default_group().failure_policy.end_job_on_error = sys.argv[1] == "1"
x = np.ones(4)
md.all_reduce(x)
if md.get_rank() == 1:
    raise RuntimeError("rank one gives up")
md.all_reduce(x)
