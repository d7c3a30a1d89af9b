"""Prints the MPICH shared-memory files a rank maps, then ends one way (tests/fastpath/test_mpi_shm_files.py).

    ./mpirun.sh -n 2 python tests/fastpath/shm_files_rank.py raise|exit3|wait|clean
"""

import os
import sys
import time

import numpy as np

import minidist as md
from minidist.comm.transports import shm_files

mode = sys.argv[1]
md.init_process_group()
x = np.ones(1 << 12)
md.all_reduce(x)
print(f"SHM {md.get_rank()} pid={os.getpid()} {' '.join(shm_files.mapped())}", flush=True)
md.all_reduce(x)  # every rank has printed its files before rank 1 ends the job
if mode == "raise" and md.get_rank() == 1:
    raise RuntimeError("rank one fails")
if mode == "exit3" and md.get_rank() == 1:
    sys.exit(3)
if mode == "wait":
    deadline = time.monotonic() + 60  # bounded even if the signal never comes
    while time.monotonic() < deadline:
        md.all_reduce(x)
        time.sleep(0.01)
md.all_reduce(x)
md.destroy_process_group()
