"""CUDA-IPC all-reduce (algorithm "cuda_ipc"): the shared-memory all-reduce's twin for GPU memory.

    group.all_reduce(grads_on_gpu, algorithm="cuda_ipc")   # ranks of one node, CuPy buffers

The ranks of a node map each other's device memory with CUDA IPC and add straight from it: no
message carries data, and nothing goes through host memory. Set-up, once per transport (and
again when a larger buffer comes, collectively): every rank allocates a device WINDOW with its
own ``cudaMalloc`` (not CuPy's pool: IPC maps whole allocations), gets its IPC handle, the
ranks all-gather the handles, and each opens its peers' windows. Each window has two halves
(double buffering: a call's copy-in may start while a slow peer still copies out of the last
call's half). Per call, N=3, slices cut at 64-byte multiples::

    windows:  rank 0 [ a0 | a1 | a2 ]      (1) copy my buffer into my window (device copy)
              rank 1 [ b0 | b1 | b2 ]      (2) my stream is done -> barrier (a tiny host
              rank 2 [ c0 | c1 | c2 ]          all-gather of headers: numel, dtype, op, call)
                        |    |    |        (3) ONE kernel: rank r reduces slice r reading it
              rank 1 reads a1, b1, c1          in every window, in rank order, into its own
              over IPC, writes b1 = sum        window (a1 + b1 + c1 -> b1)
                                           (4) my stream is done -> barrier
                                           (5) copy slice j out of rank j's window, for every j

Every slice is reduced once, in rank order, then copied: every rank ends with identical bits.
Between phases the ranks synchronize their stream, then meet at a host barrier over the
transport (so a peer never reads a window before the copy into it has finished).

Only for device (CuPy) buffers, ranks in separate processes on one node, at most 8 ranks
(the kernel's argument list), stream 0. Anything else raises a ValueError that says what to use
instead; ``cuda_ipc_available`` tells ``auto``. The structure runs on the CPU in the tests with
host "windows" (``run_cuda_ipc`` takes any ``Windows``), and the kernel under the simulator.
"""

from __future__ import annotations

import weakref
from typing import Any, Protocol

import numpy as np

from minidist import xp as backend
from minidist.comm.algorithms.registry import Algorithm
from minidist.comm.algorithms.ring import ring_all_gather
from minidist.comm.algorithms.shm import line_aligned_bounds
from minidist.comm.errors import CollectiveMismatch
from minidist.comm.ops import ReduceOp, combine, finalize
from minidist.comm.topology import detect_topology
from minidist.comm.transports.base import Transport, stream_of
from minidist.kernels.fallback import CompiledBackend

MAX_RANKS = 8
MIN_HALF_BYTES = 1 << 20
_OPS = list(ReduceOp)


class Windows(Protocol):
    """One rank's view of the node's windows: its own and the peers' (device memory)."""

    half_bytes: int
    half: int

    def slots(self, half: int, dtype: Any, numel: int) -> list[Any]:
        """Every rank's window half ``half`` as ``numel`` elements of ``dtype`` (rank order)."""

    def copy(self, dst: Any, src: Any) -> None:
        """``dst[...] = src`` on this rank's stream (device to device)."""

    def reduce(self, out: Any, sources: list[Any], op: ReduceOp) -> None:
        """``out = sources[0] (op) sources[1] ...`` in one kernel on this rank's stream."""

    def sync(self) -> None:
        """Block until this rank's stream has finished everything queued so far."""

    def close(self) -> None:
        """Unmap the peers' windows and free mine."""


class CudaIpcWindows:
    """``Windows`` over CUDA IPC: a ``cudaMalloc`` per rank, peers opened by IPC handle."""

    def __init__(self, transport: Transport, half_bytes: int, tag: int) -> None:
        cupy = backend.require_cuda()
        rt = cupy.cuda.runtime
        self._cupy, self._rt = cupy, rt
        self.half_bytes, self.half = half_bytes, 0
        nbytes = 2 * half_bytes
        me, n = transport.rank, transport.size
        self._own = rt.malloc(nbytes)
        handle = np.frombuffer(bytes(rt.ipcGetMemHandle(self._own)), np.uint8)
        size = handle.size
        handles = np.zeros(n * size, np.uint8)
        handles[me * size:(me + 1) * size] = handle
        ring_all_gather(transport, handles, tag)
        self._peers: list[int] = []
        ptrs = []
        for j in range(n):
            if j == me:
                ptrs.append(self._own)
            else:
                ptr = rt.ipcOpenMemHandle(bytes(handles[j * size:(j + 1) * size]))
                self._peers.append(ptr)
                ptrs.append(ptr)
        self._windows = [
            cupy.ndarray((nbytes,), cupy.uint8,
                         memptr=cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(p, nbytes, self),
                                                        0))
            for p in ptrs]

    def slots(self, half: int, dtype: Any, numel: int) -> list[Any]:
        lo = half * self.half_bytes
        nbytes = numel * np.dtype(dtype).itemsize
        return [w[lo:lo + nbytes].view(dtype) for w in self._windows]

    def copy(self, dst: Any, src: Any) -> None:
        dst[...] = src

    def reduce(self, out: Any, sources: list[Any], op: ReduceOp) -> None:
        _REDUCE.call("reduce_slices", _reduce_reference, out, sources, op.value)

    def sync(self) -> None:
        self._cupy.cuda.get_current_stream().synchronize()

    def close(self) -> None:
        for ptr in self._peers:
            self._rt.ipcCloseMemHandle(ptr)
        self._peers = []
        if self._own:
            self._rt.free(self._own)
            self._own = 0


# The reduce kernel, loaded and rehearsed by minidist.kernels.fallback: if it cannot compile
# or launch here, one warning, then CuPy's ufuncs in the same rank order (the same bits).
_REDUCE = CompiledBackend("numba-cuda", "minidist.kernels.reduce_cuda",
                          "Install numba-cuda for your CUDA version (`pip install "
                          "'numba-cuda[cu12]'`) for the one-launch slice reduction.")


def _reduce_reference(out: Any, sources: list[Any], op: str) -> None:
    acc = sources[0].copy()
    for s in sources[1:]:
        combine(acc, s, ReduceOp(op))
    out[...] = acc


def _barrier(transport: Transport, header: list[int], tag: int) -> list[list[int]]:
    """A host barrier that also all-gathers every rank's header (a few int64s)."""
    k = len(header)
    rows = np.zeros(transport.size * k, np.int64)
    rows[transport.rank * k:(transport.rank + 1) * k] = header
    ring_all_gather(transport, rows, tag)
    return rows.reshape(transport.size, k).tolist()


def _check_headers(transport: Transport, rows: list[list[int]]) -> None:
    mine = rows[transport.rank]
    for j, other in enumerate(rows):
        if other != mine:
            raise CollectiveMismatch(
                f"[rank {transport.rank}/{transport.size}] all_reduce(algorithm=\"cuda_ipc\"): "
                f"rank {j} passed (numel, dtype, op, call) = {other} but rank {transport.rank} "
                f"passed {mine}. Every rank must pass the same shape, dtype and op.")


def _grow(windows: Windows | None, nbytes: int, make: Any) -> Windows:
    """Windows whose halves hold ``nbytes`` (collective: every rank asks for the same size)."""
    if windows is not None and windows.half_bytes >= nbytes:
        return windows
    if windows is not None:
        windows.close()
    half = max(MIN_HALF_BYTES, 1 << max(nbytes - 1, 1).bit_length())
    return make(half)


def _header(flat: Any, op: ReduceOp, tag: int, fits: bool) -> list[int]:
    return [flat.size, flat.dtype.num, _OPS.index(op), tag, int(fits)]


def run_cuda_ipc(windows: Windows, transport: Transport, flat: Any, op: ReduceOp,
                 tag: int = 0) -> None:
    """Steps (1)-(5) of the module docstring over ``windows`` (big enough: see ``_grow``).

    Barrier (2) all-gathers each rank's header (numel, dtype, op, call, "my window was big
    enough"): a mismatch raises CollectiveMismatch on every rank, after the copy-in.
    """
    n, me = transport.size, transport.rank
    inner = ReduceOp.SUM if op is ReduceOp.AVG else op
    slots = windows.slots(windows.half, flat.dtype, flat.size)
    b = line_aligned_bounds(flat.size, n, flat.itemsize)
    windows.copy(slots[me], flat)  # (1)
    windows.sync()
    _check_headers(transport, _barrier(transport, _header(flat, op, tag, True), tag))  # (2)
    lo, hi = b[me], b[me + 1]
    if hi > lo:  # (3) my slice, from every window, rank order
        windows.reduce(slots[me][lo:hi], [s[lo:hi] for s in slots], inner)
    windows.sync()
    _barrier(transport, [1], tag)  # (4)
    for j in range(n):  # (5)
        if b[j + 1] > b[j]:
            windows.copy(flat[b[j]:b[j + 1]], slots[j][b[j]:b[j + 1]])
    windows.half ^= 1
    finalize(flat, op, n)


def _refuse(transport: Transport, what: str, fix: str) -> ValueError:
    return ValueError(f"[rank {transport.rank}/{transport.size}] all_reduce(algorithm="
                      f"\"cuda_ipc\"): {what}. {fix}")


def check_cuda_ipc(transport: Transport, buf: Any, tag: int = 0) -> None:
    """Raise the ValueError that says why "cuda_ipc" cannot run here (nothing sent yet)."""
    if not backend.is_device_array(buf):
        raise _refuse(transport, f"needs a device (CuPy) array, got {type(buf).__name__}",
                      "Use algorithm='shm' or 'auto' for host arrays, or move the buffer to "
                      "the GPU")
    if not backend.gpu_available():
        raise _refuse(transport, "no usable CUDA device", "Use algorithm='auto'")
    if transport.one_process:
        raise _refuse(transport, f"the {transport.name!r} transport runs every rank in one "
                      "process, and CUDA IPC maps memory between processes",
                      "Run the ranks as processes (mpiexec, or the TCP transport)")
    if transport.size > MAX_RANKS:
        raise _refuse(transport, f"{transport.size} ranks; the reduce kernel reads at most "
                      f"{MAX_RANKS} windows", "Use algorithm='hier' or 'auto'")
    if stream_of(tag):
        raise _refuse(transport, f"stream {stream_of(tag)}; the windows serve stream 0 only",
                      "Use tag=0, another group (new_group), or algorithm='auto'")
    if not detect_topology(transport).is_single_node():
        raise _refuse(transport, "the ranks span several nodes; CUDA IPC maps memory within "
                      "one node", "Use algorithm='hier' or 'auto'")


_WINDOWS: "weakref.WeakKeyDictionary[Transport, Windows]" = weakref.WeakKeyDictionary()


def _windows_for(transport: Transport, flat: Any, op_index: int, tag: int) -> Windows:
    """The transport's windows, grown (collectively, after the ranks agreed on the header)
    when ``flat`` does not fit."""
    windows = _WINDOWS.get(transport)
    if windows is None or windows.half_bytes < flat.nbytes:  # agree first, then grow together
        header = [flat.size, flat.dtype.num, op_index, tag, 0]
        _check_headers(transport, _barrier(transport, header, tag))
        windows = _WINDOWS[transport] = _grow(windows, flat.nbytes,
                                              lambda half: CudaIpcWindows(transport, half, tag))
    return windows


def cuda_ipc_all_reduce(transport: Transport, buf: Any, op: ReduceOp, tag: int = 0) -> None:
    """All-reduce the device array ``buf`` (1-D contiguous CuPy) in place over CUDA IPC.

    Raises:
        ValueError: a host array, no GPU, ranks in one process, more than 8 ranks, a stream
            other than 0, or ranks on several nodes (before anything is sent).
        CollectiveMismatch: ranks passed different numel/dtype/op (on every rank).
    """
    n = transport.size
    if n == 1:
        finalize(buf, op, n)
        return
    check_cuda_ipc(transport, buf, tag)
    flat = buf.reshape(-1)
    windows = _windows_for(transport, flat, _OPS.index(op), tag)
    if flat.size:
        run_cuda_ipc(windows, transport, flat, op, tag)


def run_ipc_all_gather(windows: Windows, transport: Transport, flat: Any, bounds: list[int],
                       tag: int = 0) -> None:
    """Rank r's ``flat[bounds[r]:bounds[r + 1]]`` into every rank's ``flat``, through the
    windows: copy my part in, sync, barrier (headers compared), copy the others' parts out."""
    me = transport.rank
    slots = windows.slots(windows.half, flat.dtype, flat.size)
    lo, hi = bounds[me], bounds[me + 1]
    if hi > lo:
        windows.copy(slots[me][lo:hi], flat[lo:hi])
    windows.sync()
    header = [flat.size, flat.dtype.num, -1, tag, 1]
    _check_headers(transport, _barrier(transport, header, tag))
    for j in range(transport.size):
        if j != me and bounds[j + 1] > bounds[j]:
            windows.copy(flat[bounds[j]:bounds[j + 1]], slots[j][bounds[j]:bounds[j + 1]])
    windows.half ^= 1


def cuda_ipc_all_gather(transport: Transport, buf: Any, bounds: list[int], tag: int = 0) -> None:
    """All-gather over CUDA IPC: rank r contributes ``buf[bounds[r]:bounds[r + 1]]`` of the
    device array ``buf``; afterwards every rank holds every part (hier's node phase (3))."""
    if transport.size == 1:
        return
    check_cuda_ipc(transport, buf, tag)
    flat = buf.reshape(-1)
    windows = _windows_for(transport, flat, -1, tag)
    if flat.size:
        run_ipc_all_gather(windows, transport, flat, bounds, tag)


def cuda_ipc_available(transport: Transport, buf: Any, tag: int = 0) -> bool:
    """True when "cuda_ipc" can run ``buf`` here (``auto``'s question; collective the first
    time, like ``detect_topology``)."""
    if not backend.is_device_array(buf) or transport.size < 2:
        return False
    try:
        check_cuda_ipc(transport, buf, tag)
    except ValueError:
        return False
    return True


# Device buffers on one node: "auto" takes it before weighing the host algorithms, and the
# planner hands it the device buffer itself (no staging through host memory).
CUDA_IPC = Algorithm("cuda_ipc", cuda_ipc_all_reduce, usable=cuda_ipc_available,
                     candidate=False, takes_device_buffers=True,
                     preferred="device buffer, ranks on one node: CUDA IPC windows")

__all__ = ["CUDA_IPC", "cuda_ipc_all_reduce", "cuda_ipc_all_gather", "cuda_ipc_available",
           "check_cuda_ipc", "run_cuda_ipc", "run_ipc_all_gather", "CudaIpcWindows", "Windows",
           "MAX_RANKS"]
