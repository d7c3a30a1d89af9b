"""Two shared-memory all-reduces in flight at once (rank body); rank 0 prints ``RESULT {...}``.

    ./mpirun.sh -n 2 python tests/fastpath/shm_concurrent_rank.py      # tests/fastpath/test_shm_concurrent_mpi.py

1. two groups (the world and ``new_group`` of the same ranks), one thread each, ``shm`` calls
   of every path (small, copy, chunked, a shared-window buffer) at the same time: every
   result is checked;
2. DDP (its comm thread reduces buckets with ``shm`` on the world) while a user thread runs
   ``shm`` all-reduces on the other group: DDP matches one process on the global batch;
3. one group, two threads on two streams: stream 0 may use the shared window, ``auto`` on
   stream 1 takes a message-passing algorithm, ``algorithm="shm", tag=1`` is a ValueError.
"""

from __future__ import annotations

import json
import os
import sys
import threading

import numpy as np

import minidist
from minidist import comm

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "ddp"))
from ddp_rank import close, data, identical_everywhere, train_ddp, train_reference  # noqa: E402

SIZES = (3, 1000, 20000, 300000)  # small path, copy path, and (CHUNK_BYTES set low) chunks


def hammer(group, seed: int, rounds: int, errors: list, tag: int = 0,
           algorithm: str = "shm", shared: bool = False) -> None:
    """``rounds`` all-reduces on ``group``; every result checked against the expected sum."""
    n, r = group.size, group.rank
    bufs = {s: group.alloc_buffer(s, np.float64) if shared else np.empty(s) for s in SIZES}
    try:
        for i in range(rounds):
            s = SIZES[i % len(SIZES)]
            base = np.arange(s, dtype=np.float64) * (seed + 1) + i
            x = bufs[s]
            x[...] = base + r
            group.all_reduce(x, algorithm=algorithm, tag=tag)
            expected = n * base + n * (n - 1) / 2
            if not np.array_equal(x, expected):
                errors.append(f"seed {seed} round {i} size {s}: max error "
                              f"{float(np.max(np.abs(x - expected)))}")
                return
    except Exception as e:  # noqa: BLE001 - reported by the test, not a hang
        errors.append(f"seed {seed}: {type(e).__name__}: {e}")


def in_threads(*targets) -> None:
    threads = [threading.Thread(target=fn, args=args, kwargs=kw) for fn, args, kw in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)


def main() -> None:
    comm.init_process_group()
    world = comm.get_default_group()
    other = minidist.new_group(list(range(world.size)))  # same ranks, its own transport
    res: dict = {"n": world.size, "has_shm": [world.shared_memory is not None, other.shared_memory is not None]}

    # 1. two groups, two threads, every shm path, shared-window buffers on one of them
    errors: list = []
    in_threads((hammer, (world, 1, 60, errors), {}),
               (hammer, (other, 2, 60, errors), {"shared": True}))
    res["two_groups"] = errors

    # 2. DDP's comm thread on the world while a user thread reduces on the other group
    errors = []
    xs, ys = data(3, 1, world.size)
    ref = train_reference("sgd", xs, ys)
    out: dict = {}

    def ddp() -> None:
        m = train_ddp("sgd", xs, ys, world.rank, algorithm="shm", bucket_cap_mb=1e-4,
                      first_bucket_cap_mb=1e-4)  # many buckets: many comm-thread calls
        out["close"] = close(m, ref)
        out["model"] = m
    in_threads((ddp, (), {}), (hammer, (other, 3, 40, errors), {}))
    res["ddp_close"] = out.get("close", False)
    res["ddp_identical"] = identical_everywhere(out["model"]) if "model" in out else False
    res["ddp_user_thread"] = errors

    # 3. one group, two streams: shm on stream 0, auto on stream 1 (never shm there)
    errors = []
    in_threads((hammer, (world, 4, 40, errors), {}),
               (hammer, (world, 5, 40, errors), {"tag": 1, "algorithm": "auto"}))
    res["two_streams"] = errors
    res["stream1_algorithms"] = sorted({e.algorithm for e in world.ledger.entries()
                                        if e.stream == 1})
    try:
        world.all_reduce(np.ones(4), algorithm="shm", tag=1)
        res["shm_tag1"] = ""
    except ValueError as e:
        res["shm_tag1"] = str(e)
    rows = world.all_gather_object(res)
    if world.rank == 0:
        print("RESULT " + json.dumps(rows), flush=True)
    comm.destroy_process_group()


if __name__ == "__main__":
    main()
