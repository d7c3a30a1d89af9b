"""Staging a device buffer's all-reduce through host memory (minidist.fastpath.staging), on the CPU.

The "device" is a stand-in whose two copy queues hold real copies and run them only when an
event is waited for, in queue order, as a GPU stream would: a pipeline that read a chunk
before waiting for its download, or returned before the last upload, gives wrong numbers
here. The host all-reduce is the real ring over thread ranks. GPU twin:
tests/cuda/test_staging_gpu.py.
"""

import numpy as np
import pytest

from minidist.comm.algorithms.ring import ring_all_reduce
from minidist.comm.ops import ReduceOp
from minidist.fastpath.staging import Stager, chunk_bounds, needs_staging, stager_for
from minidist.comm.transports.threads import run_threads


class LazyStream:
    def __init__(self, name, log):
        self.name, self.log, self.queue, self.done = name, log, [], 0

    def push(self, op):
        self.queue.append(op)
        return (self, len(self.queue))

    def run_until(self, n):
        while self.done < n:
            self.queue[self.done]()
            self.done += 1


class LazyCopies:
    """``Copies`` over NumPy "device" arrays: copies run when waited for (or never)."""

    def __init__(self):
        self.log, self.allocations = [], 0
        self.down, self.up = LazyStream("down", self.log), LazyStream("up", self.log)

    def host_buffer(self, numel, dtype):
        self.allocations += 1
        return np.full(numel, np.nan, dtype)  # garbage until a download lands

    def start(self, device_buf):
        self.log.append("start")

    def download(self, device_chunk, host_chunk):
        k = self.index(host_chunk)
        self.log.append(f"down{k}")
        return self.down.push(lambda: host_chunk.__setitem__(Ellipsis, device_chunk))

    def upload(self, host_chunk, device_chunk):
        k = self.index(host_chunk)
        self.log.append(f"up{k}")
        return self.up.push(lambda: device_chunk.__setitem__(Ellipsis, host_chunk))

    def wait(self, event):
        stream, n = event
        self.log.append(f"wait-{stream.name}")
        stream.run_until(n)

    def index(self, host_chunk):
        return self.chunk_starts.index(host_chunk.__array_interface__["data"][0])


def staged_ring(n, numel, chunk_bytes, dtype=np.float32, op=ReduceOp.SUM, calls=1):
    """Every thread rank stages its "device" buffer through a LazyCopies; returns per rank
    (result, log, copies)."""
    def body(transport):
        rng = np.random.default_rng(transport.rank)
        copies = LazyCopies()
        stager = Stager(copies, chunk_bytes=chunk_bytes)
        results = []
        dev = np.empty(numel, dtype)  # one "bucket", refilled every call
        for call in range(calls):
            dev[...] = rng.standard_normal(numel) * 10
            want = dev.copy()
            host = stager.host_buffer(dev)
            copies.chunk_starts = [host[lo:].__array_interface__["data"][0]
                                   for lo, _ in chunk_bounds(numel, dev.itemsize, chunk_bytes)]

            def reduce_chunk(chunk):
                copies.log.append(f"reduce{copies.index(chunk)}")
                ring_all_reduce(transport, chunk, op, 0)

            stager.all_reduce(dev, reduce_chunk)
            ring_all_reduce(transport, want, op, 0)  # the same data reduced unstaged
            results.append((dev.copy(), want))
        return results, copies
    return run_threads(n, body, timeout_s=60)


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("numel,chunk_bytes", [(1000, 400), (1001, 4000), (7, 4), (3, 400)])
def test_staged_all_reduce_equals_the_sum_on_every_rank(n, numel, chunk_bytes):
    out = staged_ring(n, numel, chunk_bytes)
    inputs = [(np.random.default_rng(r).standard_normal(numel) * 10).astype(np.float32)
              for r in range(n)]
    total = np.sum(inputs, axis=0, dtype=np.float64)
    first = out[0][0][0][0]
    for results, _ in out:
        dev, _ = results[0]
        assert np.array_equal(dev.view(np.uint32), first.view(np.uint32))  # identical bits
        np.testing.assert_allclose(dev, total, rtol=1e-5, atol=1e-4)


def test_chunk_schedule_overlaps_down_reduce_up():
    """Chunk k is reduced while k+1 copies down (queued before) and k-1 copies up."""
    out = staged_ring(2, 1000, 1000)  # 250 floats per chunk: 4 chunks
    log = out[0][1].log
    assert log == ["start", "down0",
                   "down1", "wait-down", "reduce0", "up0",
                   "down2", "wait-down", "reduce1", "up1",
                   "down3", "wait-down", "reduce2", "up2",
                   "wait-down", "reduce3", "up3",
                   "wait-up"]


def test_pinned_buffer_allocated_once_per_bucket_and_avg_op():
    out = staged_ring(2, 999, 1000, op=ReduceOp.AVG, calls=3)
    for results, copies in out:
        assert copies.allocations == 1  # the bucket's host buffer, reused by every call
        for dev, want in results:
            assert np.array_equal(dev, want)
    stager = Stager(LazyCopies())
    a, b = np.zeros(10, np.float32), np.zeros(10, np.float32)
    assert stager.host_buffer(a) is stager.host_buffer(a) is not stager.host_buffer(b)
    assert stager.copies.allocations == 2


def test_missing_waits_would_be_caught_by_the_stand_in():
    copies = LazyCopies()
    dev, host = np.ones(4, np.float32), np.zeros(4, np.float32)
    copies.chunk_starts = [host.__array_interface__["data"][0]]
    event = copies.download(dev, host)
    assert host.sum() == 0  # not run yet
    copies.wait(event)
    assert host.sum() == 4


def test_chunk_bounds_rule_and_env(monkeypatch):
    assert chunk_bounds(0, 4) == []
    assert chunk_bounds(10, 4, 16) == [(0, 4), (4, 8), (8, 10)]
    whole = chunk_bounds(16 << 20, 4)  # 64 MiB: 4 MiB chunks
    assert len(whole) == 16 and whole[-1] == (15 << 20, 16 << 20)
    assert len(chunk_bounds(1 << 18, 4)) == 4  # 1 MiB: quarters of 256 KiB
    assert len(chunk_bounds(1000, 4)) == 1  # small: one chunk
    monkeypatch.setenv("MINIDIST_STAGE_CHUNK_BYTES", "400")
    assert len(chunk_bounds(1000, 4)) == 10
    monkeypatch.setenv("MINIDIST_STAGE_CHUNK_BYTES", "lots")
    with pytest.raises(ValueError, match="MINIDIST_STAGE_CHUNK_BYTES"):
        chunk_bounds(1000, 4)


def test_who_is_staged():
    class Aware:
        def cuda_aware(self):
            return True

    class NotAware:
        def cuda_aware(self):
            return False

    from minidist.comm.transports.local import LocalTransport

    assert needs_staging(NotAware()) and needs_staging(LocalTransport())  # TCP, threads: stage
    assert not needs_staging(Aware())  # a CUDA-aware MPI gets device pointers
    assert stager_for(NotAware(), np.zeros(3)) is None  # host buffers are never staged


def test_host_buffers_are_bounded(monkeypatch):
    import minidist.fastpath.staging as staging

    monkeypatch.setattr(staging, "MAX_HOST_BYTES", 100)
    stager = Stager(LazyCopies())
    arrays = [np.zeros(10, np.float32) for _ in range(4)]  # 40 bytes each
    for a in arrays:
        stager.host_buffer(a)
    assert len(stager._host) == 2  # 80 bytes kept: the two most recent
    assert stager.host_buffer(arrays[3]) is stager.host_buffer(arrays[3])
    assert stager.copies.allocations == 4
