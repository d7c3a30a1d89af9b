"""Small device all-reduces through host memory (algorithm "host_copy"): down, reduce, up.

    group.all_reduce(small_grad_on_gpu, algorithm="host_copy")   # any transport, CuPy buffer

For a few kilobytes, a device all-reduce is all latency: CUDA IPC pays N + 1 copies, a launch
and a few flag round trips on the GPU, plus whatever two processes sharing a GPU pay to take
turns on it. A copy down to pinned memory, the host all-reduce (MPI's Allreduce: tens of
microseconds) and a copy up can be faster. One buffer, one stream (the caller's), no chunking
(the staging pipeline's chunks, streams and events are for large buffers)::

    caller's stream:  ... backward ... | D2H |                 | H2D |  later work
    host:                              wait  | host all-reduce | queue H2D, return

The copy down blocks (the host needs the data); the copy up is queued on the caller's stream,
so the result is ready in stream order, like ``cuda_ipc``'s. The pinned buffer is reused per
device buffer (address, size, dtype): the next call's copy down waits for the stream, hence
for the last copy up out of it, before the host writes into it again.

**Which sizes.** ``auto`` takes "host_copy" for a device buffer only below the cut-over that
``python -m minidist.tune`` measured on this machine (``calibrate``: both paths timed on a
device buffer, the size rule ``"<n>d"``, e.g. ``[[98304, "host_copy"], [None, "cuda_ipc"]]``).
Without such a measurement ``auto`` keeps "cuda_ipc" at every size: no guessed constant.

The device side is a small interface (``HostCopies``); CI runs the algorithm with a stand-in
whose copy up is deferred until the next copy down or ``sync``, as a stream would run it.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import Any, Protocol

import numpy as np

from minidist import xp as backend
from minidist.fastpath.mpi_native import mpi_all_reduce, supports_native
from minidist.comm.algorithms.recursive_doubling import rd_all_reduce
from minidist.comm.algorithms.registry import Algorithm, model
from minidist.comm.ops import ReduceOp, finalize
from minidist.comm.transports.base import Transport
from minidist.logger import human_bytes

MAX_PINNED = 64  # pinned buffers kept per transport (least recently used go first)


class HostCopies(Protocol):
    """The device side of "host_copy": pinned buffers and the two copies."""

    def pinned(self, numel: int, dtype: Any) -> np.ndarray:
        """A host array of ``numel`` elements (page-locked on a GPU)."""

    def down(self, device_buf: Any, host: np.ndarray) -> None:
        """``host[...] = device_buf`` after the work queued on the caller's stream; blocks."""

    def up(self, host: np.ndarray, device_buf: Any) -> None:
        """Queue ``device_buf[...] = host`` on the caller's stream; returns at once."""


class CupyHostCopies:
    """``HostCopies`` on a CUDA GPU: CuPy's current stream and pinned host memory."""

    def __init__(self) -> None:
        self._cupy = backend.require_cuda()
        import cupyx

        self._cupyx = cupyx

    def pinned(self, numel: int, dtype: Any) -> np.ndarray:
        return self._cupyx.empty_pinned((numel,), dtype=dtype)

    def down(self, device_buf: Any, host: np.ndarray) -> None:
        device_buf.get(stream=self._cupy.cuda.get_current_stream(), out=host, blocking=True)

    def up(self, host: np.ndarray, device_buf: Any) -> None:
        device_buf.set(host, stream=self._cupy.cuda.get_current_stream())


class _Pinned:
    """One transport's copies and pinned buffers (least recently used evicted)."""

    def __init__(self, copies: HostCopies) -> None:
        self.copies = copies
        self.buffers: OrderedDict[tuple, np.ndarray] = OrderedDict()

    def host_for(self, buf: Any, address: int) -> np.ndarray:
        key = (address, buf.size, buf.dtype.str)
        host = self.buffers.get(key)
        if host is None:
            host = self.buffers[key] = self.copies.pinned(buf.size, buf.dtype)
            if len(self.buffers) > MAX_PINNED:
                self.buffers.popitem(last=False)
        else:
            self.buffers.move_to_end(key)
        return host


_STATE: "weakref.WeakKeyDictionary[Transport, _Pinned]" = weakref.WeakKeyDictionary()


def run_host_copy(transport: Transport, buf: Any, op: ReduceOp, tag: int, copies: HostCopies,
                  address: int) -> None:
    """Copy ``buf`` (1-D) down, all-reduce it on the host, queue the copy up.

    ``copies``' pinned buffers are kept per transport (the first ``copies`` given stays);
    ``address``: ``buf``'s address (which pinned buffer).
    """
    state = _STATE.get(transport)
    if state is None:
        state = _STATE[transport] = _Pinned(copies)
    host = state.host_for(buf, address)
    state.copies.down(buf, host)
    inner = ReduceOp.SUM if op is ReduceOp.AVG else op
    if supports_native(transport):  # MPI's Allreduce: the fastest small host all-reduce
        mpi_all_reduce(transport, host, inner, tag)
    else:
        rd_all_reduce(transport, host, inner, tag)  # fewest latencies elsewhere
    finalize(host, op, transport.size)
    state.copies.up(host, buf)


def host_copy_all_reduce(transport: Transport, buf: Any, op: ReduceOp, tag: int = 0) -> None:
    """All-reduce the device array ``buf`` (1-D contiguous CuPy) in place through pinned host
    memory (module docstring). The copy up is queued on CuPy's current stream.

    Raises:
        ValueError: ``buf`` is not a device array (before anything is sent).
    """
    if not backend.is_device_array(buf):
        raise ValueError(f"[rank {transport.rank}/{transport.size}] all_reduce(algorithm="
                         f"\"host_copy\"): needs a device (CuPy) array, got "
                         f"{type(buf).__name__}. Host arrays need no copy: use "
                         "algorithm='auto'.")
    if transport.size == 1:
        finalize(buf, op, 1)
        return
    flat = buf.reshape(-1)
    copies = _STATE[transport].copies if transport in _STATE else CupyHostCopies()
    run_host_copy(transport, flat, op, tag, copies, int(flat.data.ptr))


def choose_device(world_size: int, nbytes: int, calibration: Any) -> tuple[str, str]:
    """``(algorithm, reason)`` for a device buffer that "cuda_ipc" can reduce: "host_copy"
    below the measured cut-over of ``calibration`` (its rule ``"<n>d"``), else "cuda_ipc"."""
    rule = calibration.rules.get(f"{world_size}d") if calibration is not None else None
    if not rule:
        return "cuda_ipc", ("device buffer, ranks on one node: CUDA IPC windows (no measured "
                            "cut-over for small device buffers: python -m minidist.tune)")
    if not calibration.covers(nbytes):
        return "cuda_ipc", ("device buffer, ranks on one node: CUDA IPC windows (beyond the "
                            "calibrated sizes)")

    lower = 0
    for upper, name in rule:  # noqa: B007 - the last name is the answer
        if upper is None or nbytes < upper:
            break
        lower = upper
    span = (f"size < {human_bytes(upper)}" if upper and not lower else
            f"{human_bytes(lower)} <= size < {human_bytes(upper)}" if upper else
            f"size >= {human_bytes(lower)}")
    return name, f"calibrated rule ({calibration.describe()}) for device buffers: {span} -> {name}"


DEVICE_CANDIDATES = ["cuda_ipc", "host_copy"]
"""What a calibration times on a device buffer (``calibrate.measure``'s "device" kind)."""


def device_cost(n: int, k: float, a: float, b: float, g: float) -> float:
    """``a + K b + K(n-1)/n g``: the cost row of "cuda_ipc" and "host_copy" (for the record:
    "auto" picks between them by a calibration's measured size rule, not by this model)."""
    return a + k * b + k * (n - 1) / n * g


def _device_buffer(transport: Transport, buf: Any, stream: int) -> bool:
    return backend.is_device_array(buf)


# Not weighed by "auto" (no candidate): "cuda_ipc"'s ``refine`` hands it the device buffers
# below the measured cut-over. It reads the device buffer itself (the planner stages nothing).
HOST_COPY = Algorithm("host_copy", host_copy_all_reduce, usable=_device_buffer,
                      cost=device_cost, constants=model(alpha_us=40.0, beta_us_per_byte=4e-5),
                      candidate=False, takes_device_buffers=True)

__all__ = ["HOST_COPY", "host_copy_all_reduce", "run_host_copy", "HostCopies",
           "CupyHostCopies", "choose_device", "device_cost", "DEVICE_CANDIDATES"]
