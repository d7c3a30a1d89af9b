"""One rank raises, the others wait in a collective: the whole job must end at once.

    ./mpirun.sh -n 3 python tests/launch/failing_rank.py          # main thread raises
    ./mpirun.sh -n 3 python tests/launch/failing_rank.py thread   # a worker thread raises
Exits non-zero in about a second, the traceback prefixed with the failing rank.
"""

import sys
import threading

import numpy as np

import minidist as md


def fail() -> None:
    raise RuntimeError("deliberate failure on the last rank")


md.init_process_group(timeout=120)  # a long deadline: only the abort can end the job quickly
if md.get_rank() == md.get_world_size() - 1:
    if sys.argv[1:] == ["thread"]:
        worker = threading.Thread(target=fail, name="comm-worker")
        worker.start()
        worker.join()  # the thread's excepthook aborts the job before this returns
    else:
        fail()
md.all_reduce(np.ones(4, np.float32))  # the other ranks block here until the abort
print("unreachable: the all_reduce completed", flush=True)
