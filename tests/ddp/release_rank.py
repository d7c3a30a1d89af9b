"""Rank script (mpiexec -n 2): DDP.close(release_buffers=True) frees the bucket windows.

Builds and closes a DDP model several times: the shared windows must not pile up, the grads
must stay readable after close, and the averaged grads must equal the ones of overlap on.
Prints "RESULT <json>" on rank 0.
"""

from __future__ import annotations

import json

import numpy as np

from minidist import comm, nn
from minidist.fastpath.shm_window import shm_node
from minidist.ddp import DistributedDataParallel
from minidist.tensor import Tensor


def one_model(overlap: bool) -> tuple[list, int]:
    nn.manual_seed(0)
    m = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    ddp = DistributedDataParallel(m, overlap=overlap, first_bucket_cap_mb=0.0001)
    x = np.random.default_rng(comm.get_rank()).normal(size=(4, 6)).astype(np.float32)
    (ddp(Tensor(x)) ** 2).mean().backward()
    ddp.close(release_buffers=True)
    windows = len(shm_node(comm.get_default_group().transport).user_windows)
    return [p.grad.array.copy() for p in m.parameters()], windows


def main() -> None:
    comm.init_process_group()
    runs = [one_model(overlap=i % 2 == 0) for i in range(4)]
    grads = [g for g, _ in runs]
    res = {"windows_after_close": [w for _, w in runs],
           "same_grads": all(np.array_equal(a, b) for g in grads[1:] for a, b in zip(grads[0], g)),
           "grads_nonzero": all(np.any(g) for g in grads[0])}
    if comm.get_rank() == 0:
        print("RESULT " + json.dumps(res), flush=True)
    comm.destroy_process_group()


if __name__ == "__main__":
    main()
