"""One rank leaves through Python's exit while the others go on (tests/watch/test_rank_exit.py).

    ./mpirun.sh -n 2 python tests/watch/leaving_rank.py mid 3     # rank 1: sys.exit(3) mid-job
    ./mpirun.sh -n 2 python tests/watch/leaving_rank.py mid 0     # rank 1 returns mid-job
    ./mpirun.sh -n 2 python tests/watch/leaving_rank.py mid raise3  # raise SystemExit(3)
    ./mpirun.sh -n 2 python tests/watch/leaving_rank.py end plain # every rank ends, no destroy
    modes of "end": plain, destroy, exit3 (every rank sys.exit(3) at the end), late (rank 0
    works 2 s longer before it ends)
"""

import sys
import time

import numpy as np

import minidist as md

mode, arg = sys.argv[1], sys.argv[2]
md.init_process_group()
rank = md.get_rank()
x = np.ones(4)
md.all_reduce(x)
if mode == "mid" and rank == 1:
    print(f"rank {rank} leaves after 1 collective", flush=True)
    if arg == "0":
        pass  # the rest of the script is skipped: rank 1 returns normally
    elif arg == "raise3":
        raise SystemExit(3)  # the same as sys.exit(3) for Python; its code is not visible here
    else:
        sys.exit(int(arg))
elif mode == "mid" or mode == "end":
    md.all_reduce(x)
    print(f"rank {rank} finished: {x[0]:g}", flush=True)
    if mode == "end" and arg == "destroy":
        md.destroy_process_group()
    elif mode == "end" and arg == "exit3":
        sys.exit(3)
    elif mode == "end" and arg == "late" and rank == 0:
        time.sleep(2.0)
