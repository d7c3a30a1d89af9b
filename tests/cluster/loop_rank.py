"""Rank body for tests/cluster/: DDP steps until something fails (a cut link, a killed node).

Every rank prints ``STEP k`` after each step; on an error it prints ``FAILED: <message>`` and
exits 1 (the launcher then stops the node's other ranks).
"""

from __future__ import annotations

import itertools
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "ddp"))

from ddp_rank import B, Net, data, loss_fn  # noqa: E402

from minidist import comm  # noqa: E402
from minidist.ddp import DistributedDataParallel  # noqa: E402
from minidist.tensor import Tensor  # noqa: E402


def main() -> None:
    comm.init_process_group()
    rank, n = comm.get_rank(), comm.get_world_size()
    ddp = DistributedDataParallel(Net(), algorithm="hier")
    xs, ys = data(1, 1, n)
    sl = slice(rank * B, (rank + 1) * B)
    try:
        for step in itertools.count():
            loss_fn(ddp(Tensor(xs[0, 0, sl])), ys[0, 0, sl]).backward()
            print(f"STEP {step}", flush=True)
            time.sleep(0.05)
    except Exception as e:  # noqa: BLE001 - the message is what the test reads
        print(f"FAILED: {type(e).__name__}: {e}", flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
