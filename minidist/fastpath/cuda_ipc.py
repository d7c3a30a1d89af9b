"""CUDA-IPC all-reduce (algorithm "cuda_ipc"): the shared-memory all-reduce's twin for GPU memory.

    group.all_reduce(grads_on_gpu, algorithm="cuda_ipc")   # ranks of one node, CuPy buffers
    group.all_reduce(host_array, algorithm="ipc_host")     # the same protocol on host windows

The ranks of a node map each other's device memory with CUDA IPC (ipc_device.py) and add
straight from it: no message carries data, nothing goes through host memory, and the host
only queues work. Per call c (half h = (c - 1) % 2 of every window), N=3, slices cut at 64-byte
multiples::

    windows:  rank 0 [ a0 | a1 | a2 ]      (0) host: the call's header agrees with the peers'
              rank 1 [ b0 | b1 | b2 ]          (ipc_sync.RowAgreement: a few microseconds)
              rank 2 [ c0 | c1 | c2 ]      (1) wait OUT[j] >= c-2: nobody still reads half h
                        |    |    |            copy my buffer into my window;  signal IN = c
              rank 1 reads a1, b1, c1      (2) wait IN[j] >= c; ONE kernel: rank r reduces
              over IPC, writes b1 = sum        slice r from every window, in rank order, into
                                               its own window;                signal RED = c
                                           (3) wait RED[j] >= c; copy slice j out of rank j's
                                               window, for every j;           signal OUT = c

(1)-(3) are queued on the caller's stream: the flags are stored and awaited by the GPU
(``MINIDIST_IPC_ORDER=stream``), or by the host after a stream sync (``host``); see
ipc_sync.py for why the counters make the double buffering safe. Every slice is reduced once,
in rank order, then copied: every rank ends with identical bits.

**Launch plans.** Everything a call needs besides the buffer's address is built once per
(window half, numel, dtype, op, stream) and cached on the transport's ``IpcState``: the window
addresses of the copies, the reduce's views of the slices and its configured kernel launch
(``reduce_cuda.reduce_plan``: Numba views, the compiled kernel, pre-packed arguments). A call
is a dictionary lookup, N + 1 ``cudaMemcpyAsync``, one launch and 3(N-1) + 3 flag operations.

Windows are allocated on the first call and grown (collectively, after the header check: every
rank grows at the same call) when a larger buffer comes; the old ones are freed only after
every rank synced its stream. ``destroy_process_group`` frees them (``close_ipc``: sync, unmap
the peers, a barrier, free mine); at exit the peers' mappings are closed.

Only for device (CuPy) buffers, ranks in separate processes on one node, at most 8 ranks,
stream 0; anything else raises a ValueError saying what to use instead. "ipc_host" runs the
same protocol, plans and flags on host windows (MPI shared memory, thread ranks): the CPU twin.
"""

from __future__ import annotations

import atexit
import weakref
from typing import Any, Callable, NamedTuple

import numpy as np

from minidist import xp as backend
from minidist.fastpath.host_copy import choose_device, device_cost
from minidist.fastpath.ipc_sync import (IN, OUT, RED, HostControl, MessageAgreement,
                                               RowAgreement, host_control, meet)
from minidist.fastpath.ipc_windows import Windows, host_windows
from minidist.comm.algorithms.registry import Algorithm, model
from minidist.fastpath.shm import line_aligned_bounds
from minidist.comm.errors import CommError
from minidist.comm.ops import ReduceOp, finalize
from minidist.comm.topology import detect_topology
from minidist.comm.transports.base import Transport, stream_of
from minidist.logger import get_logger

log = get_logger(__name__)

MAX_RANKS = 8
MIN_HALF_BYTES = 1 << 20
MAX_PLANS = 64
CALL_LIMIT = 1 << 31  # flags are uint32 call numbers: new windows (flags at 0) before they wrap


class IpcPlan(NamedTuple):
    """One (half, numel, dtype, op, stream): what a call queues, as addresses and a launch."""

    nbytes: int
    mine: int                              # my window half: where my buffer is copied in
    outs: list[tuple[int, int, int]]       # (offset in the buffer, window address, bytes)
    reduce: Callable[[], None] | None      # my slice's reduce launch (None: empty slice)


class IpcState:
    """One transport's CUDA-IPC state: control lines, windows, plans and the call counter.

    Args:
        control: the ranks' host control lines, or None (no shared host memory).
        agreement: the per-call header check.
        make: ``make(half_bytes) -> Windows`` (collective).
    """

    def __init__(self, control: HostControl | None, agreement: Any,
                 make: Callable[[int], Windows]) -> None:
        self.control, self.agreement, self.make = control, agreement, make
        self.windows: Windows | None = None
        self.plans: dict = {}
        self.calls = 0  # collectives so far (the same on every rank)
        self.base = 0   # calls made before the current windows (their flags count from here)
        self.plans_built = 0

    @property
    def half(self) -> int:
        """The half the next call uses (call c of the windows uses half (c - 1) % 2)."""
        return (self.calls - self.base) & 1

    def fit(self, transport: Transport, nbytes: int, tag: int) -> Windows:
        """Windows whose halves hold ``nbytes``: grown together (every rank agreed on the
        header first, so every rank grows at the same call)."""
        w = self.windows
        if w is not None and w.half_bytes >= nbytes and self.calls - self.base < CALL_LIMIT:
            return w
        if w is not None:
            w.sync()  # my stream touches no window any more; after the barrier, nobody's does
            w.close(lambda: meet(transport, tag))
        half = max(MIN_HALF_BYTES, 1 << max(nbytes - 1, 1).bit_length())
        self.windows = self.make(half)
        self.base = self.calls - 1  # the current call is call 1 of these windows
        self.plans.clear()
        return self.windows

    def plan(self, w: Windows, half: int, flat: Any, op: ReduceOp, stream: Any, n: int,
             me: int) -> IpcPlan:
        key = (half, flat.size, flat.dtype.char, op, stream)
        plan = self.plans.get(key)
        if plan is None:
            if len(self.plans) >= MAX_PLANS:
                self.plans.clear()
            plan = self.plans[key] = _build_plan(w, half, flat, op, n, me)
            self.plans_built += 1
        return plan

    def close(self, transport: Transport, tag: int = 0) -> None:
        """Free the windows and control lines (collective: ``destroy_process_group``)."""
        if self.windows is not None:
            self.windows.close(lambda: meet(transport, tag))
            self.windows = None
        if self.control is not None:
            self.control.close()
            self.control = None
        self.plans.clear()


def _build_plan(w: Windows, half: int, flat: Any, op: ReduceOp, n: int, me: int) -> IpcPlan:
    inner = ReduceOp.SUM if op is ReduceOp.AVG else op
    b = line_aligned_bounds(flat.size, n, flat.itemsize)
    isz = flat.itemsize
    lo, hi = b[me], b[me + 1]
    reduce = None
    if hi > lo:
        slices = [w.view(j, half, flat.dtype, flat.size)[lo:hi] for j in range(n)]
        reduce = w.reduce_launch(slices[me], slices, inner)
    outs = [(b[j] * isz, w.base(j, half) + b[j] * isz, (b[j + 1] - b[j]) * isz)
            for j in range(n) if b[j + 1] > b[j]]
    return IpcPlan(flat.nbytes, w.base(me, half), outs, reduce)


def _header(flat: Any, op_code: int, tag: int) -> list[int]:
    return [flat.size, flat.dtype.num, op_code, tag]


def run_cuda_ipc(state: IpcState, transport: Transport, flat: Any, op: ReduceOp,
                 tag: int = 0) -> None:
    """Steps (0)-(3) of the module docstring: all-reduce ``flat`` (1-D) in place.

    Raises:
        CollectiveMismatch: ranks passed different numel/dtype/op (on every rank, step 0).
    """
    n, me = transport.size, transport.rank
    call = state.calls + 1
    state.agreement.check(_header(flat, op.code, tag), call)  # (0)
    state.calls = call
    if flat.size == 0:
        return
    w = state.fit(transport, flat.nbytes, tag)
    c = call - state.base
    half = (c - 1) & 1
    stream = w.begin()
    plan = state.plan(w, half, flat, op, stream, n, me)
    sig = w.signals
    peers = [j for j in range(n) if j != me]
    if c > 2:
        for j in peers:  # (1) every peer is done with this half (call c - 2)
            sig.wait(j, OUT, c - 2)
    p = w.address(flat)
    w.memcpy(plan.mine, p, plan.nbytes)
    sig.signal(IN, c)
    for j in peers:  # (2)
        sig.wait(j, IN, c)
    if plan.reduce is not None:
        plan.reduce()
    sig.signal(RED, c)
    for j in peers:  # (3)
        sig.wait(j, RED, c)
    for off, src, nbytes in plan.outs:
        w.memcpy(p + off, src, nbytes)
    sig.signal(OUT, c)
    finalize(flat, op, n)


def run_ipc_all_gather(state: IpcState, transport: Transport, flat: Any, bounds: list[int],
                       tag: int = 0) -> None:
    """Rank r's ``flat[bounds[r]:bounds[r + 1]]`` into every rank's ``flat``, through the
    windows: copy my part in, signal IN, wait for the peers', copy their parts out."""
    me, n = transport.rank, transport.size
    call = state.calls + 1
    state.agreement.check(_header(flat, -1, tag), call)
    state.calls = call
    if flat.size == 0:
        return
    w = state.fit(transport, flat.nbytes, tag)
    c = call - state.base
    half = (c - 1) & 1
    w.begin()
    sig, isz = w.signals, flat.itemsize
    peers = [j for j in range(n) if j != me]
    if c > 2:
        for j in peers:
            sig.wait(j, OUT, c - 2)
    p = w.address(flat)
    lo, hi = bounds[me], bounds[me + 1]
    if hi > lo:
        w.memcpy(w.base(me, half) + lo * isz, p + lo * isz, (hi - lo) * isz)
    sig.signal(IN, c)
    for j in peers:
        sig.wait(j, IN, c)
        if bounds[j + 1] > bounds[j]:
            off = bounds[j] * isz
            w.memcpy(p + off, w.base(j, half) + off, (bounds[j + 1] - bounds[j]) * isz)
    sig.signal(RED, c)  # (nothing reduced: keeps every flag at the call number)
    sig.signal(OUT, c)


def _refuse(transport: Transport, what: str, fix: str, name: str = "cuda_ipc") -> ValueError:
    return ValueError(f"[rank {transport.rank}/{transport.size}] all_reduce(algorithm="
                      f"\"{name}\"): {what}. {fix}")


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
    _check_common(transport, tag, "cuda_ipc")


def _check_common(transport: Transport, tag: int, name: str) -> None:
    if transport.size > MAX_RANKS:
        raise _refuse(transport, f"{transport.size} ranks; the reduce kernel reads at most "
                      f"{MAX_RANKS} windows", "Use algorithm='hier' or 'auto'", name)
    if stream_of(tag):
        raise _refuse(transport, f"stream {stream_of(tag)}; the windows serve stream 0 only",
                      "Use tag=0, another group (new_group), or algorithm='auto'", name)
    if not transport.one_process and not detect_topology(transport).is_single_node():
        raise _refuse(transport, "the ranks span several nodes; IPC maps memory within "
                      "one node", "Use algorithm='hier' or 'auto'", name)


def check_ipc_host(transport: Transport, buf: Any, tag: int = 0) -> None:
    """Raise the ValueError that says why "ipc_host" cannot run here (nothing sent yet)."""
    if type(buf) is not np.ndarray:
        raise _refuse(transport, f"needs a host (NumPy) array, got {type(buf).__name__}",
                      "Use algorithm='cuda_ipc' for device arrays", "ipc_host")
    if not transport.one_process and transport.mpi is None:
        raise _refuse(transport, f"the {transport.name!r} transport's ranks share no host "
                      "memory", "Use the MPI transport (mpiexec) or thread ranks", "ipc_host")
    _check_common(transport, tag, "ipc_host")


_STATES: "weakref.WeakKeyDictionary[Transport, dict[str, IpcState]]" = \
    weakref.WeakKeyDictionary()


def ipc_state(transport: Transport, kind: str, tag: int = 0, reduce_planner: Any = None
              ) -> IpcState:
    """The transport's ``IpcState`` for ``kind`` ("device" or "host"), made on first use
    (collective: the control lines). ``reduce_planner``: see ``HostWindows``."""
    states = _STATES.setdefault(transport, {})
    state = states.get(kind)
    if state is None:
        control = host_control(transport, tag)
        agreement = RowAgreement(control, transport) if control is not None else \
            MessageAgreement(transport, tag)
        if kind == "device":
            from minidist.fastpath.ipc_device import CudaIpcWindows

            def make(half: int) -> Windows:
                return CudaIpcWindows(transport, half, control, tag)
        else:
            if control is None:
                raise _refuse(transport, "no shared host memory", "Use the MPI transport",
                              "ipc_host")

            def make(half: int) -> Windows:
                assert control is not None
                return host_windows(transport, half, control, tag, reduce_planner)
        state = states[kind] = IpcState(control, agreement, make)
    return state


def cuda_ipc_all_reduce(transport: Transport, buf: Any, op: ReduceOp, tag: int = 0) -> None:
    """All-reduce the device array ``buf`` (1-D contiguous CuPy) in place over CUDA IPC.

    Returns once the work is queued on CuPy's current stream (stream order, module docstring).

    Raises:
        ValueError: a host array, no GPU, ranks in one process, more than 8 ranks, a stream
            other than 0, or ranks on several nodes (before anything is sent).
        CollectiveMismatch: ranks passed different numel/dtype/op (on every rank).
    """
    if transport.size == 1:
        finalize(buf, op, 1)
        return
    check_cuda_ipc(transport, buf, tag)
    run_cuda_ipc(ipc_state(transport, "device", tag), transport, buf.reshape(-1), op, tag)


def ipc_host_all_reduce(transport: Transport, buf: Any, op: ReduceOp, tag: int = 0) -> None:
    """"cuda_ipc"'s protocol, plans and flags on host windows (a NumPy ``buf``): its CPU twin,
    for ranks that share host memory (MPI on one node, thread ranks). ``auto`` never picks it:
    "shm" is the fast host algorithm."""
    if transport.size == 1:
        finalize(buf, op, 1)
        return
    check_ipc_host(transport, buf, tag)
    run_cuda_ipc(ipc_state(transport, "host", tag), transport, buf.reshape(-1), op, tag)


def cuda_ipc_all_gather(transport: Transport, buf: Any, bounds: list[int], tag: int = 0) -> None:
    """All-gather over CUDA IPC: rank r contributes ``buf[bounds[r]:bounds[r + 1]]`` of the
    device array ``buf``; afterwards every rank holds every part (hier's node phase (3))."""
    if transport.size == 1:
        return
    check_cuda_ipc(transport, buf, tag)
    run_ipc_all_gather(ipc_state(transport, "device", tag), transport, buf.reshape(-1), bounds,
                       tag)


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


def close_ipc(transport: Transport) -> None:
    """Free ``transport``'s IPC windows and control lines (collective; the process group's
    ``close`` calls it before the transport closes). A peer that is gone: logged, not raised."""
    for state in _STATES.pop(transport, {}).values():
        try:
            state.close(transport)
        except CommError as e:
            log.warning("cuda_ipc: could not release the IPC windows cleanly: %s", e)


@atexit.register
def _detach_at_exit() -> None:
    """At exit, close the peers' mappings still open (the driver frees my own windows)."""
    for state in [st for states in list(_STATES.values()) for st in states.values()]:
        try:
            getattr(state.windows, "detach", lambda: None)()
        except Exception:  # the driver may be shutting down already
            pass


def ipc_host_usable(transport: Transport, buf: Any, tag: int = 0) -> bool:
    """True when "ipc_host" can run ``buf`` here (never asked by "auto": not a candidate)."""
    try:
        check_ipc_host(transport, buf, tag)
    except ValueError:
        return False
    return transport.size > 1


# Device buffers on one node: "auto" takes it before weighing the host algorithms (below the
# cut-over a calibration measured on a GPU, "host_copy" instead: ``refine``), and the planner
# hands it the device buffer itself (no staging through host memory). Its cost row is for the
# record (a calibration fits it from the device timings); "auto" never weighs it.
CUDA_IPC = Algorithm("cuda_ipc", cuda_ipc_all_reduce, usable=cuda_ipc_available,
                     cost=device_cost, constants=model(alpha_us=60.0, beta_us_per_byte=2e-7),
                     candidate=False, takes_device_buffers=True,
                     preferred="device buffer, ranks on one node: CUDA IPC windows",
                     refine=choose_device)
# The same protocol on host windows: cuda_ipc's CPU twin (tests, benchmarks --cpu).
IPC_HOST = Algorithm("ipc_host", ipc_host_all_reduce, usable=ipc_host_usable, candidate=False)

__all__ = ["CUDA_IPC", "IPC_HOST", "cuda_ipc_all_reduce", "cuda_ipc_all_gather",
           "cuda_ipc_available", "ipc_host_all_reduce", "ipc_host_usable", "check_cuda_ipc",
           "check_ipc_host", "run_cuda_ipc", "run_ipc_all_gather", "ipc_state", "close_ipc",
           "IpcState", "IpcPlan", "Windows", "MAX_RANKS"]
