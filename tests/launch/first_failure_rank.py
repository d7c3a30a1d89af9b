"""Rank 1 of 3 fails at step 5 while the others all-reduce (tests/launch/test_first_failure.py).

    python -m minidist.launch --nproc-per-node 3 tests/launch/first_failure_rank.py raise
    ... first_failure_rank.py os_exit       # rank 1: os._exit(3), no word to anyone

``raise``: rank 1 raises RuntimeError, and a thread keeps its process alive 3 s longer, as a
busy machine may: the ranks that only waited for it exit first, so a launcher that names the
first process it reaps names the wrong rank.
"""

import os
import sys
import threading
import time

import numpy as np

import minidist as md

mode = sys.argv[1]
md.init_process_group()
x = np.ones(1024, np.float32)
for step in range(200):
    if md.get_rank() == 1 and step == 5:
        if mode == "raise":
            threading.Thread(target=time.sleep, args=(3.0,)).start()  # a slow exit
            raise RuntimeError("rank one broke at step 5")
        os._exit(3)
    md.all_reduce(x)
md.destroy_process_group()
