"""An async all_reduce whose peer has not joined: wait(timeout) raises, the job still ends well.

    ./mpirun.sh -n 2 python tests/comm/async_timeout_rank.py /tmp/marker   # or 2 TCP ranks

Rank 1 stays out of the collective until rank 0's ``wait(timeout=1)`` has raised CommTimeout
(rank 0 then creates the marker file); it joins late, the collective completes in the
background, ``wait()`` returns True, and both ranks shut down cleanly. Rank 0 prints
``RESULT {...}``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

import minidist
from minidist import comm


def main() -> None:
    marker = Path(sys.argv[1])
    comm.init_process_group()
    rank = comm.get_rank()
    x = np.array([float(rank + 1)])
    if rank == 0:
        work = minidist.all_reduce(x, async_op=True)
        res: dict = {"pending_before": work.is_completed()}
        try:
            work.wait(timeout=1.0)
            res["error_type"] = None
        except comm.CommTimeout as e:
            res["error_type"], res["error"] = type(e).__name__, str(e)
        res["completed_after_timeout"] = work.is_completed()
        marker.touch()                               # let rank 1 join now
        res["late_wait"] = work.wait()
        res["sum"] = float(x[0])
    else:
        deadline = time.monotonic() + 60
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        minidist.all_reduce(x)
    one = np.array([1.0])
    minidist.all_reduce(one)                         # the group still works afterwards
    if rank == 0:
        res["after"] = float(one[0])
        print("RESULT " + json.dumps(res), flush=True)
    comm.destroy_process_group()


if __name__ == "__main__":
    main()
