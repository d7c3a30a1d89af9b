"""One rank of the shared-memory all-reduce test job (run under mpiexec by test_shm.py).

    mpiexec -n 3 python tests/fastpath/shm_rank.py

Checks, at any world size: bit-identical results vs the NumPy oracle (same rank order) and across
ranks, every dtype and op, numel 0/1/<n/odd/several chunks; the zero-copy path (buffers from
shm_alloc_buffer); a mixed call (shared on some ranks only); a numel mismatch that must raise
CommError on every rank and leave the window usable. Prints ``OK shm rank r``.
"""

import hashlib

import numpy as np
from mpi4py import MPI

from minidist.fastpath.shm import (CHUNK_BYTES, shm_all_reduce, shm_alloc_buffer,
                                          shm_close, shm_is_shared)
from minidist.comm.errors import CommError
from minidist.comm.ops import ReduceOp, reference_reduce
from minidist.comm.transports.mpi import MPITransport

t = MPITransport(timeout_s=20)
r, n = t.rank, t.size


def world_of(numel, dtype, seed):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        return (rng.normal(size=(n, numel)) * 10).astype(dtype)
    return rng.integers(-50, 50, size=(n, numel)).astype(dtype)


def check(buf, expected, what):
    if not np.array_equal(buf, expected, equal_nan=True):
        bad = np.flatnonzero(buf != expected)
        raise SystemExit(f"[rank {r}/{n}] {what}: {bad.size} wrong, first at {bad[:3]}: "
                         f"{buf[bad[:3]]} vs {expected[bad[:3]]}")
    digest = hashlib.sha1(buf.tobytes()).hexdigest()
    if len(set(t.comm.allgather(digest))) != 1:
        raise SystemExit(f"[rank {r}/{n}] {what}: ranks disagree on the result bits")


big = min(CHUNK_BYTES // 4 * 2 + 37, 300_001)  # > 2 chunks when MINIDIST_SHM_CHUNK_BYTES is small
numels = [0, 1, max(n - 1, 1), n + 1, 1027, big]
for numel in numels:
    for dtype in ("float16", "float32", "float64", "int32", "int64"):
        for op in ReduceOp:
            if op is ReduceOp.PROD and np.dtype(dtype).kind == "f" and numel > 1027:
                continue
            world = world_of(numel, dtype, numel)
            buf = world[r].copy()
            shm_all_reduce(t, buf, op)
            check(buf, reference_reduce(list(world), op), f"copy path {numel} {dtype} {op}")

# Zero-copy: the buffer lives in a shared window (every rank allocates alike), also a slice of it.
shared = shm_alloc_buffer(t, big, np.float32)
for sl in (slice(None), slice(64, 64 + 1001)):
    for op in (ReduceOp.SUM, ReduceOp.MAX, ReduceOp.AVG):
        world = world_of(big, np.float32, 7)[:, sl]
        view = shared[sl]
        assert shm_is_shared(t, view) and not shm_is_shared(t, world[r].copy())
        view[:] = world[r]
        shm_all_reduce(t, view, op)
        check(view, reference_reduce(list(world), op), f"zero-copy {sl} {op}")

# Every rank's slot of a window starts on a cache line, whatever its size (DDP's gradient
# slots sit on cache lines of a bucket, so the bucket must start on one too).
for odd in (1, 10, 1001, 1_059_850):
    b = shm_alloc_buffer(t, odd, np.float32)
    assert b.ctypes.data % 64 == 0, f"rank {r}: {odd} floats start {b.ctypes.data % 64} into a line"

# Mixed: rank 0 passes its shared buffer, the others plain arrays: still correct.
world = world_of(big, np.float32, 8)
buf = shared if r == 0 else np.empty(big, np.float32)
buf[:] = world[r]
shm_all_reduce(t, buf, ReduceOp.SUM)
check(buf, reference_reduce(list(world), ReduceOp.SUM), "mixed")

# A mismatch raises everywhere, naming the ranks' values; the next call still works.
if n > 1:
    try:
        shm_all_reduce(t, np.ones(10 + (r == n - 1), np.float32), ReduceOp.SUM)
        raise SystemExit(f"[rank {r}/{n}] mismatch not detected")
    except CommError as e:
        assert "numel=11" in str(e) and "numel=10" in str(e), str(e)
    try:  # the op is decoded from the header too
        shm_all_reduce(t, np.ones(10, np.float32), ReduceOp.MAX if r == n - 1 else ReduceOp.SUM)
        raise SystemExit(f"[rank {r}/{n}] op mismatch not detected")
    except CommError as e:
        assert "op=max" in str(e) and "op=sum" in str(e), str(e)
world = world_of(5000, np.float64, 9)
buf = world[r].copy()
shm_all_reduce(t, buf, ReduceOp.SUM)
check(buf, reference_reduce(list(world), ReduceOp.SUM), "after mismatch")

shm_close(t)
t.close()
print(f"OK shm rank {r}", flush=True)
