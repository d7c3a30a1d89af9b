"""The small shared-memory all-reduce (mailboxes) under real ranks; rank 0 prints ``RESULT``.

    ./mpirun.sh -n 3 python tests/fastpath/mailbox_rank.py   # test_shm_mailbox_mpi.py

1. sizes around the mailbox's limit, every dtype and op, through the process group: the
   NumPy oracle's bits (rank order), the same on every rank;
2. 300 calls in one seeded order that every rank draws alike: mailbox, MPI's Allreduce and the
   larger shm paths interleaved (they share the guard's call numbers and the mailboxes
   alternate), each result checked;
3. the last rank calls MPI's Allreduce where the others use the mailbox, same size: every rank
   raises CollectiveMismatch at once (the fingerprints meet in the guard line), long before
   the 30 s deadline.
"""

from __future__ import annotations

import json
import time

import numpy as np

import minidist as md
from minidist.comm import CollectiveMismatch
from minidist.comm.ops import ReduceOp, reference_reduce
from minidist.fastpath.shm_window import SMALL_BYTES


def world_of(n, numel, dtype, seed):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        return (rng.normal(size=(n, numel)) * 10).astype(dtype)
    return rng.integers(-50, 50, size=(n, numel)).astype(dtype)


def main() -> None:
    md.init_process_group()
    g = md.comm.get_default_group()
    r, n = g.rank, g.size
    res: dict = {"wrong": [], "algorithms": set()}

    # 1. around the limit
    for dtype in ("float16", "float32", "float64", "int32", "int64"):
        item = np.dtype(dtype).itemsize
        for numel in (0, 1, n + 1, SMALL_BYTES // item - 1, SMALL_BYTES // item,
                      SMALL_BYTES // item + 1):
            for op in ReduceOp:
                world = world_of(n, numel, dtype, numel + op.code)
                buf = world[r].copy()
                g.all_reduce(buf, op=op, algorithm="shm")
                want = reference_reduce(list(world), op)
                if not np.array_equal(buf, want, equal_nan=True):
                    res["wrong"].append(f"{numel} x {dtype} {op.value}")

    # 2. interleaved: every rank draws the same sequence
    rng = np.random.default_rng(7)
    for i in range(300):
        numel = int(rng.choice([1, 3, 100, 2000, SMALL_BYTES // 4, 20000]))
        algorithm = str(rng.choice(["shm", "mpi", "auto"]))
        world = world_of(n, numel, np.float32, i)
        buf = world[r].copy()
        g.all_reduce(buf, algorithm=algorithm)
        if not np.array_equal(buf, reference_reduce(list(world), ReduceOp.SUM)) and \
                algorithm == "shm":  # (MPI's own sum order may round differently)
            res["wrong"].append(f"call {i}: {numel} {algorithm}")
        if not np.allclose(buf, world.sum(0), rtol=1e-4, atol=1e-3):
            res["wrong"].append(f"call {i}: {numel} {algorithm} far off")
    res["digest"] = float(buf.sum())
    res["algorithms"] = sorted({e.algorithm for e in g.ledger.entries()})

    rows = g.transport.comm.allgather(res)
    if r == 0:
        print("RESULT " + json.dumps(rows), flush=True)

    # 3. a mailbox call meets MPI's Allreduce (last: the MPI rank's request stays posted)
    t0 = time.monotonic()
    try:
        g.all_reduce(np.ones(4, np.float32), algorithm="mpi" if r == n - 1 else "shm")
        found = None
    except CollectiveMismatch as e:
        found = str(e)
    print("MISMATCH " + json.dumps({"rank": r, "error": found, "s": time.monotonic() - t0}),
          flush=True)


if __name__ == "__main__":
    main()
