"""Device windows of the CUDA-IPC all-reduce, and phase flags the GPU stores and waits for.

    windows = CudaIpcWindows(transport, half_bytes, control)   # collective; CuPy + a GPU

Each rank allocates its window with its own ``cudaMalloc`` (not CuPy's pool: IPC maps whole
allocations), the ranks all-gather the IPC handles, and each opens its peers'. The window
starts with the three phase flags (one 64-byte line each, zeroed before the handles go out),
then the two halves::

    [ IN | RED | OUT | pad ][ half 0 ][ half 1 ]        (flags: uint32 call numbers)

**Stream order** (``MINIDIST_IPC_ORDER=stream``; ``auto`` picks it where the CUDA driver
bindings import): a ``signal`` is ``cuStreamWriteValue32`` on the caller's stream (the store
happens after the work queued before it, with a memory barrier), a ``wait`` is
``cuStreamWaitValue32(..., GEQ)`` on a peer's flag (the stream's later work waits; the host
does not). So an all-reduce queues copies, one reduce launch and flag operations, and returns:
the result is ready in stream order, like any kernel's. ``host`` order syncs the stream at each
phase and meets the peers on host flags (an MPI shared window) or, without shared host memory,
at a host barrier: what the algorithm did before flags existed, kept to compare and as the
fallback.

The copies are ``cudaMemcpyAsync`` on raw addresses (a few microseconds of host time, no
CuPy slicing); the reduce is ``reduce_cuda``'s kernel through a launch plan (built once per
window half, size, dtype, op and stream; see cuda_ipc.py), with CuPy's ufuncs as the fallback.
Nothing here runs without a GPU: the same algorithm runs in CI on ``HostWindows``.
"""

from __future__ import annotations

from typing import Any, Callable, Hashable

import numpy as np

from minidist import xp as backend
from minidist.fastpath.ipc_sync import (FLAGS, IN, LINE, HostControl, HostSignals,
                                               MessageSignals, Signals)
from minidist.fastpath.ipc_windows import reduce_reference
from minidist.comm.algorithms.ring import ring_all_gather
from minidist.comm.errors import CommError
from minidist.comm.ops import ReduceOp
from minidist.comm.transports.base import Transport
from minidist.envvars import env
from minidist.kernels.fallback import CompiledBackend
from minidist.logger import get_logger

log = get_logger(__name__)

FLAG_BYTES = 256  # the three flag lines, padded so the halves start 256-byte aligned
MASK = 0xFFFFFFFF

# The reduce kernel, loaded and rehearsed by minidist.kernels.fallback: if it cannot compile
# or launch here, one warning, then CuPy's ufuncs in the same rank order (the same bits).
_REDUCE = CompiledBackend("numba-cuda", "minidist.kernels.reduce_cuda",
                          "Install numba-cuda for your CUDA version (`pip install "
                          "'numba-cuda[cu12]'`) for the one-launch slice reduction.")


def _reference_plan(out: Any, sources: list[Any], op: str) -> Callable[[], None]:
    return lambda: reduce_reference(out, sources, ReduceOp(op))


def driver_module() -> Any:
    """The CUDA driver bindings (cuda-bindings' ``driver``; older cuda-python's ``cuda``)."""
    try:
        from cuda.bindings import driver
    except ImportError:
        from cuda import cuda as driver  # type: ignore[no-redef]
    return driver


def ipc_order() -> str:
    """``MINIDIST_IPC_ORDER``: "stream" (flags on the GPU) or "host" (``auto``: "stream" where
    the driver bindings import)."""
    choice = env("MINIDIST_IPC_ORDER")
    if choice != "auto":
        return str(choice)
    try:
        driver_module()
    except ImportError:
        return "host"
    return "stream"


class StreamSignals:
    """``Signals`` the GPU executes: flag stores and waits queued on the caller's stream.

    Args:
        flags: per rank, the device addresses of its ``FLAGS`` flag words (mapped here).
        rank: this rank.
        stream: returns the handle of the stream the current call is queued on.
    """

    def __init__(self, flags: list[list[int]], rank: int, stream: Callable[[], int]) -> None:
        d = driver_module()
        self._write, self._wait, self._ok = d.cuStreamWriteValue32, d.cuStreamWaitValue32, \
            d.CUresult.CUDA_SUCCESS
        self._geq = d.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ
        self._ptrs = [[d.CUdeviceptr(a) for a in f] for f in flags]
        self._stream_of, self._cu_stream = stream, d.CUstream
        self._streams: dict[int, Any] = {}
        self.rank = rank

    def _stream(self) -> Any:
        ptr = self._stream_of()
        s = self._streams.get(ptr)
        if s is None:
            s = self._streams[ptr] = self._cu_stream(ptr)
        return s

    def signal(self, flag: int, value: int) -> None:
        self._check(self._write(self._stream(), self._ptrs[self.rank][flag], value & MASK, 0),
                    "cuStreamWriteValue32")

    def wait(self, rank: int, flag: int, value: int) -> None:
        self._check(self._wait(self._stream(), self._ptrs[rank][flag], value & MASK,
                               int(self._geq)),
                    "cuStreamWaitValue32")

    def _check(self, result: tuple, what: str) -> None:
        if result[0] != self._ok:
            raise CommError(f"all_reduce(algorithm=\"cuda_ipc\"): {what} failed ({result[0]}). "
                            "Set MINIDIST_IPC_ORDER=host to order the phases from the host.")


class CudaIpcWindows:
    """``Windows`` in device memory over CUDA IPC (see the module docstring). Collective.

    Args:
        transport: the ranks of one node (processes).
        half_bytes: bytes per half.
        control: the ranks' host control lines (host order's flags), or None.
        tag: the transport tag of the handle exchange.
    """

    def __init__(self, transport: Transport, half_bytes: int, control: HostControl | None,
                 tag: int = 0) -> None:
        cupy = backend.require_cuda()
        rt = cupy.cuda.runtime
        self._cupy, self._rt = cupy, rt
        self.half_bytes = half_bytes
        nbytes = FLAG_BYTES + 2 * half_bytes
        me, n = transport.rank, transport.size
        self.order = ipc_order()
        host_signals = None  # made (my host flags at 0) before the handle exchange meets
        if control is not None:  # (the fallback of stream order, too)
            host_signals = HostSignals(control, transport, before=self.sync)
        self._own = rt.malloc(nbytes)
        rt.memset(self._own, 0, FLAG_BYTES)
        rt.deviceSynchronize()  # the flags are zero before any peer can map them
        handle = np.frombuffer(bytes(rt.ipcGetMemHandle(self._own)), np.uint8)
        size = handle.size
        handles = np.zeros(n * size, np.uint8)
        handles[me * size:(me + 1) * size] = handle
        ring_all_gather(transport, handles, tag)
        self._peers: list[int] = []
        self._bases = []
        for j in range(n):
            if j == me:
                self._bases.append(self._own)
            else:
                ptr = rt.ipcOpenMemHandle(bytes(handles[j * size:(j + 1) * size]))
                self._peers.append(ptr)
                self._bases.append(ptr)
        self._nbytes = nbytes
        self._stream_ptr = 0
        self.views_built = 0
        self.signals: Signals
        if self.order == "stream":
            self.signals = StreamSignals([[b + f * LINE for f in range(FLAGS)]
                                          for b in self._bases], me, lambda: self._stream_ptr)
            try:  # a device or driver without stream memory operations answers here
                self.begin()
                self.signals.wait(me, IN, 0)  # my own flag, already 0: a no-op
            except (CommError, TypeError, AttributeError) as e:
                log.warning("cuda_ipc: cannot order the phases on the GPU (%s); ordering them "
                            "from the host (MINIDIST_IPC_ORDER=host)", e)
                self.order = "host"
        if self.order == "host":
            self.signals = host_signals if host_signals is not None else \
                MessageSignals(transport, self.sync, tag)

    def begin(self) -> Hashable:
        self._stream_ptr = int(self._cupy.cuda.get_current_stream().ptr)
        return self._stream_ptr

    def base(self, rank: int, half: int) -> int:
        return self._bases[rank] + FLAG_BYTES + half * self.half_bytes

    def view(self, rank: int, half: int, dtype: Any, numel: int) -> Any:
        cupy = self._cupy
        self.views_built += 1
        nbytes = numel * np.dtype(dtype).itemsize
        mem = cupy.cuda.UnownedMemory(self.base(rank, half), max(nbytes, 1), self)
        return cupy.ndarray((numel,), dtype, memptr=cupy.cuda.MemoryPointer(mem, 0))

    def address(self, array: Any) -> int:
        return int(array.data.ptr)

    def memcpy(self, dst: int, src: int, nbytes: int) -> None:
        self._rt.memcpyAsync(dst, src, nbytes, self._rt.memcpyDeviceToDevice, self._stream_ptr)

    def reduce_launch(self, out: Any, sources: list[Any], op: ReduceOp) -> Callable[[], None]:
        return _REDUCE.call("reduce_plan", _reference_plan, out, sources, op.value)

    def sync(self) -> None:
        self._cupy.cuda.get_current_stream().synchronize()

    def detach(self) -> None:
        """Unmap the peers' windows (at exit: the driver frees my own with the context)."""
        for ptr in self._peers:
            self._rt.ipcCloseMemHandle(ptr)
        self._peers = []

    def close(self, barrier: Callable[[], None]) -> None:
        self.sync()
        self.detach()
        barrier()  # no peer maps my window any more: freeing it is safe
        if self._own:
            self._rt.free(self._own)
            self._own = 0


__all__ = ["CudaIpcWindows", "StreamSignals", "ipc_order", "driver_module", "FLAG_BYTES"]
