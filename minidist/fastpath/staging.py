"""Staging device buffers through host memory for an MPI that cannot read GPU memory.

    stager = stager_for(transport, buf, fn)      # None: a host buffer, or a CUDA-aware MPI
    if stager is not None:
        stager.all_reduce(buf, lambda chunk: fn(transport, chunk, op, tag))

The PyPI MPI wheels are not CUDA-aware: a device pointer handed to them is a segfault. So a
device buffer's all-reduce runs on a host copy. Done naively (copy the whole buffer down, reduce,
copy it up, each message staged on its own) that costs the two copies plus the all-reduce in
series, and every message allocates. Here the buffer is cut into chunks and three things run
at once, on three engines (the CPU, the device-to-host and the host-to-device copy engines)::

    time ->      step 0      step 1      step 2      step 3      step 4
    down stream  D0  D1      D2          D3
    CPU              R0      R1          R2          R3
    up stream                U0          U1          U2          U3

    Dk: chunk k copied device -> pinned host buffer (async, on the "down" copy stream)
    Rk: the host all-reduce of chunk k (any algorithm; MPI sees host memory only)
    Uk: chunk k copied back host -> device (async, on the "up" copy stream)

so the all-reduce of chunk k overlaps the download of chunk k+1 and the upload of chunk k-1,
and the step costs about max(copy, reduce) per chunk plus one chunk's copies at the ends. The
host buffer of each device buffer (a DDP bucket) is pinned (page-locked: copies are DMA, async
and at full PCIe speed) and allocated once, then reused every step.

Stream order: the copies first wait for the work already queued on the caller's current stream
(the backward that wrote the gradients), through an event, without blocking the host; the host
waits for each download before reducing that chunk, and for the last upload before returning.

The device side is behind a small interface, ``Copies`` (``CupyCopies`` on a GPU), so the
pipeline itself runs on the CPU in the tests with a stand-in whose "streams" queue real copies
and run them only when an event is waited for: a missing wait gives a wrong result there.
``MINIDIST_STAGE_CHUNK_BYTES`` sets the chunk size (default: a quarter of the buffer, between
256 KiB and 4 MiB).
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Any, Callable, Protocol

import numpy as np

from minidist import xp as backend
from minidist.comm.transports.base import Transport
from minidist.envvars import env
from minidist.logger import get_logger

log = get_logger(__name__)

__all__ = ["Copies", "CupyCopies", "Stager", "stager_for", "chunk_bounds", "needs_staging"]

MIN_CHUNK_BYTES = 256 << 10
MAX_CHUNK_BYTES = 4 << 20
MAX_HOST_BUFFERS = 64  # pinned buffers kept (one per bucket); least recently used go first
MAX_HOST_BYTES = 2 << 30  # and at most this much pinned memory in all


class Copies(Protocol):
    """The device side of staging: pinned host buffers and two asynchronous copy queues."""

    def host_buffer(self, numel: int, dtype: Any) -> np.ndarray:
        """A host array of ``numel`` elements (pinned memory on a GPU)."""

    def start(self, device_buf: Any) -> None:
        """Make the copy queues wait for the work queued on the caller's stream so far."""

    def download(self, device_chunk: Any, host_chunk: np.ndarray) -> Any:
        """Queue ``host_chunk[...] = device_chunk``; return an event to ``wait`` for."""

    def upload(self, host_chunk: np.ndarray, device_chunk: Any) -> Any:
        """Queue ``device_chunk[...] = host_chunk``; return an event to ``wait`` for."""

    def wait(self, event: Any) -> None:
        """Block the host until ``event`` (and everything queued before it there) is done."""


class CupyCopies:
    """``Copies`` on a CUDA GPU: CuPy streams ("down" and "up") and pinned host memory."""

    def __init__(self) -> None:
        cupy = backend.require_cuda()
        import cupyx

        self._cupy, self._cupyx = cupy, cupyx
        self.down = cupy.cuda.Stream(non_blocking=True)
        self.up = cupy.cuda.Stream(non_blocking=True)

    def host_buffer(self, numel: int, dtype: Any) -> np.ndarray:
        return self._cupyx.empty_pinned((numel,), dtype=dtype)

    def start(self, device_buf: Any) -> None:
        ready = self._cupy.cuda.get_current_stream().record()
        self.down.wait_event(ready)
        self.up.wait_event(ready)

    def download(self, device_chunk: Any, host_chunk: np.ndarray) -> Any:
        device_chunk.get(stream=self.down, out=host_chunk, blocking=False)
        return self.down.record()

    def upload(self, host_chunk: np.ndarray, device_chunk: Any) -> Any:
        device_chunk.set(host_chunk, stream=self.up)
        return self.up.record()

    def wait(self, event: Any) -> None:
        event.synchronize()


def chunk_bounds(numel: int, itemsize: int,
                 chunk_bytes: int | None = None) -> list[tuple[int, int]]:
    """``[(lo, hi), ...]`` element ranges of the chunks (the same on every rank: it depends on
    the size only).

    >>> chunk_bounds(10, 4, chunk_bytes=16)
    [(0, 4), (4, 8), (8, 10)]
    """
    if chunk_bytes is None:
        chunk_bytes = env("MINIDIST_STAGE_CHUNK_BYTES")  # a bad value: one line (envvars.py)
        if chunk_bytes is None:
            chunk_bytes = min(max(numel * itemsize // 4, MIN_CHUNK_BYTES), MAX_CHUNK_BYTES)
    step = max(1, chunk_bytes // itemsize)
    return [(lo, min(lo + step, numel)) for lo in range(0, numel, step)]


class Stager:
    """Runs a host all-reduce of a device buffer as a chunked copy / reduce / copy pipeline.

    Args:
        copies: the device side (``CupyCopies`` on a GPU; a stand-in in tests).
        chunk_bytes: chunk size (default: ``chunk_bounds``'s rule).
    """

    def __init__(self, copies: Copies, chunk_bytes: int | None = None) -> None:
        self.copies = copies
        self.chunk_bytes = chunk_bytes
        self._host: OrderedDict[tuple, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()  # DDP's comm thread and the main thread may both stage

    def host_buffer(self, device_buf: Any) -> np.ndarray:
        """The pinned host twin of ``device_buf`` (allocated on first use, then reused; the
        least recently used go when more than ``MAX_HOST_BUFFERS`` or ``MAX_HOST_BYTES``)."""
        key = (_address(device_buf), device_buf.size, np.dtype(device_buf.dtype).str)
        with self._lock:
            host = self._host.get(key)
            if host is not None:
                self._host.move_to_end(key)
                return host
            host = self.copies.host_buffer(device_buf.size, device_buf.dtype)
            self._host[key] = host
            total = sum(h.nbytes for h in self._host.values())
            while len(self._host) > 1 and (len(self._host) > MAX_HOST_BUFFERS
                                           or total > MAX_HOST_BYTES):
                total -= self._host.popitem(last=False)[1].nbytes
            log.debug("staging: pinned host buffer of %d bytes", host.nbytes)
            return host

    def all_reduce(self, device_buf: Any, reduce_chunk: Callable[[np.ndarray], None]) -> None:
        """All-reduce ``device_buf`` (1-D, contiguous) in place: ``reduce_chunk(host_chunk)``
        must all-reduce a host array in place (every rank calls it for the same chunks, in the
        same order). Returns when the result is back in ``device_buf``."""
        n = int(device_buf.size)
        if n == 0:
            return
        host = self.host_buffer(device_buf)
        bounds = chunk_bounds(n, device_buf.itemsize, self.chunk_bytes)
        copies = self.copies
        copies.start(device_buf)
        lo, hi = bounds[0]
        down = [copies.download(device_buf[lo:hi], host[lo:hi])]
        uploaded = None
        for k, (lo, hi) in enumerate(bounds):
            if k + 1 < len(bounds):  # chunk k+1 copies down while chunk k is reduced
                nlo, nhi = bounds[k + 1]
                down.append(copies.download(device_buf[nlo:nhi], host[nlo:nhi]))
            copies.wait(down[k])
            reduce_chunk(host[lo:hi])
            uploaded = copies.upload(host[lo:hi], device_buf[lo:hi])  # overlaps chunk k+1
        copies.wait(uploaded)  # the up queue runs in order: every chunk is back


def _address(a: Any) -> int:
    if backend.is_device_array(a):
        return int(a.data.ptr)
    return int(a.__array_interface__["data"][0])


def needs_staging(transport: Transport) -> bool:
    """Whether device buffers must be staged for ``transport``: every transport but an MPI
    that is CUDA-aware (``MINIDIST_CUDA_AWARE_MPI`` / its probe), which gets device pointers."""
    return not transport.cuda_aware()


_STAGERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def stager_for(transport: Transport, buf: Any, algorithm: Any = None) -> Stager | None:
    """The transport's ``Stager`` (one per transport, made on first use) when ``buf`` is a
    device array that must be staged; None for host arrays, a CUDA-aware MPI, and algorithms
    that work on device memory themselves (``takes_device_buffers``: "cuda_ipc")."""
    if type(buf) is np.ndarray or not backend.is_device_array(buf) or \
            getattr(algorithm, "takes_device_buffers", False) or not needs_staging(transport):
        return None
    stager = _STAGERS.get(transport)
    if stager is None:
        stager = _STAGERS[transport] = Stager(CupyCopies())
    return stager
