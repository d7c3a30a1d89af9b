"""The windows of the CUDA-IPC all-reduce: every rank's buffer, mapped into every rank.

    windows = host_windows(transport, half_bytes, control)   # host memory (the CPU twin)
    windows = CudaIpcWindows(transport, half_bytes, control)   # device memory (ipc_device.py)

A window is one allocation per rank with two halves (double buffering: call c uses half
c % 2), and every peer's window is mapped into this process (CUDA IPC handles on a GPU; an
MPI-3 shared window, or one process's arrays for thread ranks, on the host)::

    rank r's window:   [ half 0: numel elements | half 1 ]     (+ the phase flags, ipc_sync.py)

What the algorithm (cuda_ipc.py) asks of a ``Windows``: addresses and views, built once per
launch plan; copies and the reduce, queued on the rank's stream; the ``signals`` that order
the phases between ranks; ``sync`` and ``close``. ``HostWindows`` implements it on host
memory, where the host thread is the stream (copies run as they are queued): the same
algorithm, plans and flag protocol run in CI without a GPU.
"""

from __future__ import annotations

import ctypes
from typing import Any, Callable, Hashable, Protocol

import numpy as np

from minidist.fastpath.ipc_sync import (HostControl, HostSignals, Signals,
                                               all_gather_header, exchange_local)
from minidist.comm.ops import ReduceOp, combine
from minidist.comm.transports.base import Transport


class Windows(Protocol):
    """One rank's view of the node's windows (its own and its peers')."""

    half_bytes: int
    signals: Signals

    def begin(self) -> Hashable:
        """Start a call: which stream it is queued on (part of the launch plan's key)."""

    def base(self, rank: int, half: int) -> int:
        """The address, in this process, of ``rank``'s window half ``half``."""

    def view(self, rank: int, half: int, dtype: Any, numel: int) -> Any:
        """``rank``'s half ``half`` as ``numel`` elements of ``dtype`` (plan time only)."""

    def address(self, array: Any) -> int:
        """The address of ``array``'s first element."""

    def memcpy(self, dst: int, src: int, nbytes: int) -> None:
        """Queue a copy of ``nbytes`` from address ``src`` to ``dst`` on my stream."""

    def reduce_launch(self, out: Any, sources: list[Any], op: ReduceOp) -> Callable[[], None]:
        """A callable that queues ``out = sources[0] (op) sources[1] ...`` (rank order), built
        once per plan (a configured kernel launch on a GPU)."""

    def sync(self) -> None:
        """Block until my stream has finished everything queued so far."""

    def close(self, barrier: Callable[[], None]) -> None:
        """Unmap the peers' windows, ``barrier()`` (every rank unmapped mine), free mine."""


def reduce_reference(out: Any, sources: list[Any], op: ReduceOp) -> None:
    """``out = sources[0] (op) sources[1] ...`` in rank order (``out`` may be any source)."""
    acc = sources[0].copy()
    for s in sources[1:]:
        combine(acc, s, op)
    out[...] = acc


class HostWindows:
    """``Windows`` on host memory: the copies and the reduce run as they are queued.

    Args:
        memories: every rank's window (uint8, ``2 * half_bytes``), mapped here, rank order.
        half_bytes: bytes per half.
        signals: the phase flags (``HostSignals`` over the ranks' host control lines).
        release: frees the memories (collective for an MPI shared window), or None.
        reduce_planner: ``planner(out, sources, op_name) -> launch`` (the CUDA kernel's
            plan under Numba's simulator); default: NumPy in rank order.
    """

    def __init__(self, memories: list[np.ndarray], half_bytes: int, signals: Signals,
                 release: Callable[[], None] | None = None,
                 reduce_planner: Callable[..., Callable[[], None]] | None = None) -> None:
        self.memories, self.half_bytes, self.signals = memories, half_bytes, signals
        self._bases = [m.ctypes.data for m in memories]
        self._release, self._planner = release, reduce_planner
        self.views_built = 0  # views made so far (a launch plan makes them, a call does not)
        self.syncs = 0

    def begin(self) -> Hashable:
        return 0

    def base(self, rank: int, half: int) -> int:
        return self._bases[rank] + half * self.half_bytes

    def view(self, rank: int, half: int, dtype: Any, numel: int) -> Any:
        self.views_built += 1
        lo = half * self.half_bytes
        return self.memories[rank][lo:lo + numel * np.dtype(dtype).itemsize].view(dtype)

    def address(self, array: Any) -> int:
        return int(array.__array_interface__["data"][0])

    def memcpy(self, dst: int, src: int, nbytes: int) -> None:
        ctypes.memmove(dst, src, nbytes)

    def reduce_launch(self, out: Any, sources: list[Any], op: ReduceOp) -> Callable[[], None]:
        if self._planner is not None:
            return self._planner(out, sources, op.value)
        return lambda: reduce_reference(out, sources, op)

    def sync(self) -> None:
        self.syncs += 1

    def close(self, barrier: Callable[[], None]) -> None:
        barrier()
        self.memories, self._bases = [], []
        if self._release is not None:
            self._release()
            self._release = None


def host_windows(transport: Transport, half_bytes: int, control: HostControl, tag: int = 0,
                 reduce_planner: Any = None) -> HostWindows:
    """``HostWindows`` for ranks that share host memory (collective): thread ranks of this
    process, or MPI ranks of one node (an MPI-3 shared window)."""
    nbytes = 2 * half_bytes
    release = None
    if transport.one_process:
        memories = exchange_local(transport, np.zeros(nbytes, np.uint8), tag)
    elif transport.mpi is not None:
        from minidist.fastpath.shm_window import shm_node

        node = shm_node(transport)
        window = node.alloc(nbytes)
        memories = [s[:nbytes] for s in window.slots]

        def release() -> None:
            node.release(window)
    else:
        raise ValueError(f"[rank {transport.rank}/{transport.size}] all_reduce(algorithm="
                         f"\"ipc_host\"): the {transport.name!r} transport's ranks share no "
                         "host memory. Use the MPI transport (mpiexec) or thread ranks.")
    signals = HostSignals(control, transport)  # my flags at 0 before the peers meet me
    all_gather_header(transport, [nbytes], tag)  # every window exists before it is used
    return HostWindows(memories, half_bytes, signals, release, reduce_planner)


__all__ = ["Windows", "HostWindows", "host_windows", "reduce_reference"]
