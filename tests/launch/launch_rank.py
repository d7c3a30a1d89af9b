"""One rank of a launcher test job (started by ``python -m minidist.launch``).

    python -m minidist.launch --standalone --nproc-per-node 2 tests/launch/launch_rank.py MODE

Modes: ``env`` (print the launcher variables, all-reduce the ranks over TCP), ``late`` (the
same, but ranks above 0 start only once the file ``GO_FILE`` exists), ``fail`` (rank 1
prints a line and exits 3; the others wait in a collective), ``wait`` (print ``READY <pid>``
and wait in a collective until the launcher's SIGINT ends the job).
"""

import os
import sys
import time

import numpy as np

import minidist as md

mode = sys.argv[1]
if mode == "late" and os.environ["RANK"] != "0":  # rank 0 waits alone in the rendezvous
    deadline = time.monotonic() + 60
    while not os.path.exists(os.environ["GO_FILE"]) and time.monotonic() < deadline:
        time.sleep(0.05)
md.init_process_group()
rank, world = md.get_rank(), md.get_world_size()
if mode in ("env", "late"):
    names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
             "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")
    print("ENV " + " ".join(f"{k}={os.environ.get(k)}" for k in names)
          + f" RUN_ID={os.environ.get('MINIDIST_RUN_ID')}"
          + f" TOKEN={'set' if os.environ.get('MINIDIST_AUTH_TOKEN') else 'unset'}")
    x = np.array([float(rank)])
    md.all_reduce(x)
    print(f"SUM {x[0]:g}")
elif mode == "fail":
    if rank == 1:
        print("rank one gives up now", flush=True)
        sys.exit(3)
    print(f"READY {os.getpid()}", flush=True)
    time.sleep(60)  # never reached past the launcher's stop
elif mode == "wait":
    print(f"READY {os.getpid()}", flush=True)
    deadline = time.monotonic() + 60  # bounded even if the test fails to signal
    while time.monotonic() < deadline:
        time.sleep(0.05)
md.destroy_process_group()
