"""ProcessGroup: a Transport plus the collectives, validated, planned, observed and run.

    group = ProcessGroup(transport)                 # any Transport: mpi, tcp, threads, local
    group.all_reduce(grad, op="sum")                # in place; algorithm="auto" by default
    group.plan_all_reduce(grad).algorithm           # what that runs ("auto" resolved)

The module-level functions in ``minidist.comm.api`` (``all_reduce``, ``get_rank``, ...) call the
default group that ``init_process_group`` creates; tests build groups over the threads transport.
The other collectives are functions of a group in collectives.py (objects.py, subgroups.py);
this module is the spine: ``all_reduce`` reads::

    validate on this rank (ValueError before any message: bad array, op, algorithm, tag)
    -> plan: planner.py, the algorithm that runs ("auto": the planner's chooser), why, and how;
       both once per kind of call (a plain call is then a lookup: its array's layout checked)
    -> begin the call (calls.py): its number on its stream and its message tag (the call's
       fingerprint); the observers start watching
    -> run it; end the call. A CommError (timeout, peer failure, fingerprint mismatch) goes to
       ``calls.diagnose`` when a wing set one (the watch wing's failure diagnosis: every rank
       raises the same finding), else it is raised as it is

Extensions (``GROUP_EXTENSIONS``): a wing attaches to every new group here, in the order the
wings loaded, the same on every rank (watch: the ledger and observers, the failure diagnosis,
the poll hook; fastpath: the node's shared memory; auto: the planner's chooser). Each returns
an object whose ``farewell()`` runs at ``destroy_process_group`` and ``close()`` before the
transport closes, last attached first.

Streams: ``tag`` (0 <= tag < MAX_STREAMS = 1024) names an independent stream with its own call
numbers, for collectives that run concurrently from different threads; one stream must be used
by one thread at a time. Async collectives (``run_async``; comm/work.py): one worker thread
per group runs them in issue order; every synchronous collective of the group first waits for
the queued ones (``drain``), so all ranks still make the group's collectives in program order.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import numpy as np

from minidist.comm import collectives, group_auto_choice, group_shared_memory, objects, subgroups
from minidist.comm.algorithms.scratch import clear as clear_scratch
from minidist.comm.calls import Call, Calls, CallSpec
from minidist.comm.errors import CommError
from minidist.comm.ops import ReduceOp
from minidist.comm.planner import Plan, Planner
from minidist.comm.topology import Topology, detect_topology
from minidist.comm.transports.base import Transport
from minidist.comm.validate import flat_view, reduce_op, stream_tag
from minidist.comm.work import AsyncWorker, Work, completed
from minidist.logger import debug_level, get_logger

log = get_logger(__name__)


# Each wing that attaches to groups adds ``make(group) -> extension or None`` here when it loads
# (see the module docstring); None: nothing to attach on this group.
GROUP_EXTENSIONS: list[Callable[[Any], Any]] = []


class ProcessGroup:
    """The ranks of one transport and the collectives over them.

    Args:
        transport: moves the bytes (``rank`` and ``size`` come from it).
        algorithm: default all-reduce algorithm: "auto" or a name of the registry
            ``minidist.comm.algorithms.ALGORITHMS`` ("ring", "tree", "rd", "direct", ...).
        check_consistency: all-gather shapes/dtypes before each collective (debug mode; the
            watch wing's check); default ``MINIDIST_DEBUG >= 1``.
        backend: name for logs ("mpi", "tcp", "threads", "local").

    Attributes:
        topology: which ranks share a node (:class:`~minidist.comm.topology.Topology`).
        calls: call numbers, message tags and the observers of every collective (calls.py).
        planner: which algorithm each all-reduce runs (planner.py).
        ledger, shared_memory: the watch wing's record of this rank's collectives, the fast
            path's node memory; None without them.
        extensions: what the wings attached to this group (``GROUP_EXTENSIONS``).

    Construction is collective on MPI and TCP: the ranks find their nodes, and the extensions
    may exchange messages too.
    """

    def __init__(self, transport: Transport, algorithm: str = "auto",
                 check_consistency: bool | None = None, backend: str | None = None) -> None:
        self.transport = transport
        self.rank, self.size = transport.rank, transport.size
        self.algorithm = algorithm
        self.backend = backend or transport.name
        self.check_consistency = (debug_level() >= 1 if check_consistency is None
                                  else check_consistency)
        self.calls = Calls(transport.max_tag, None)  # call numbers, tags, observers
        self.topology: Topology = detect_topology(transport)  # collective (MPI, TCP)
        self.ledger: Any = None  # the watch wing's record of this rank's collectives
        self.shared_memory: Any = None  # the fast-path wing's node memory
        self._worker: AsyncWorker | None = None  # started by the first run_async
        self.planner = Planner(transport)
        self.extensions = [ext for make in GROUP_EXTENSIONS  # the wings' (collective)
                           if (ext := make(self)) is not None]

    # -- helpers -----------------------------------------------------------------------------
    def where(self, call: str) -> str:
        """``"[rank r/N] call"``: how every message about ``call`` on this group begins."""
        return f"[rank {self.rank}/{self.size}] {call}"

    @contextlib.contextmanager
    def observed(self, spec: CallSpec, stream: int = 0, shape: Any = None) -> Iterator[Call]:
        """Run one collective (all_reduce does the same inline) as a call: queued async
        collectives first (so the order on the wire is the program's), then the call numbered,
        tagged and shown to the observers; the block sends with ``call.tag``. A CommError in
        the block becomes the diagnosed error (every rank raises alike)."""
        if self._worker is not None:
            self.drain()
        call = self.calls.begin(spec, stream, shape)
        try:
            yield call
        except CommError as e:
            raise self.calls.failed(call, e) from e
        self.calls.end(call)

    # -- collectives on arrays ---------------------------------------------------------------
    def all_reduce(self, array: Any, op: str | ReduceOp = "sum", algorithm: str | None = None,
                   tag: int = 0, label: str | None = None, stacklevel: int = 1) -> Any:
        """Reduce ``array`` across ranks, in place; every rank gets identical bits.

        Args:
            array: C-contiguous, writable numpy/cupy array (float16/32/64, int32/64).
            op: "sum", "avg", "max", "min", "prod" or a ReduceOp. Integer AVG floors.
            algorithm: "auto" (the planner's chooser) or a name of the registry
                ``minidist.comm.algorithms.ALGORITHMS``; default the group's.
            tag: stream, ``0 <= tag < 1024``; concurrent collectives (threads) need distinct tags.
            label: a caller's note kept in this call's ledger entry (e.g. "bucket=3"); part of
                the call's fingerprint: ranks that pass different ones raise CollectiveMismatch.
            stacklevel: whose line the ledger names, as ``warnings.warn`` counts (a wrapper: 2).

        Returns:
            ``array`` itself (torch returns None; returning the buffer allows chaining).

        Raises:
            ValueError: bad argument on this rank (nothing was sent).
            CollectiveMismatch: ranks called different collectives here.
            CommTimeout: a deadline passed; CommError: a peer failed.
        """
        algorithm = self.algorithm if algorithm is None else algorithm
        if self._worker is not None:  # queued async collectives first (see observed)
            self.drain()
        flat, rop, stream, plan = self._planned(array, op, algorithm, tag)  # 1. validate, 2. plan
        call = self.calls.begin(plan.spec, stream, array.shape, label, stacklevel)  # 3. begin
        try:
            plan.run(flat, rop, call.tag)  # 4. run
        except CommError as e:
            raise self.calls.failed(call, e) from e  # diagnosed: every rank raises alike
        self.calls.end(call)
        return array

    def _planned(self, array: Any, op: Any, algorithm: str, tag: Any) -> tuple:
        """``(flat view, ReduceOp, stream, Plan)`` of an all_reduce call, or ValueError. A plain
        call (stream 0; a 1-D numpy array, C-contiguous and writable) is checked in full once
        per kind, then looked up in the planner's ``known`` (only its layout checked again)."""
        planner, windows = self.planner, self.planner.shared_bases
        plain = not tag and type(array) is np.ndarray and array.flags.carray and array.ndim == 1
        if plain:
            in_window = id(array.base) in windows if windows else False  # (asked while any)
            key = (algorithm, op, array.dtype, array.size, in_window)
            try:
                plan = planner.known[key]
                return array, plan.spec.op, 0, plan
            except (KeyError, TypeError):  # not yet, or an op that is no dictionary key
                pass
        rop = reduce_op(self, op, what := f'all_reduce(algorithm="{algorithm}")')
        flat, stream = flat_view(self, array, what), stream_tag(self, tag, what) if tag else 0
        plan = planner.plan(algorithm, flat, rop, stream)
        if plain:
            planner.known[key] = plan
        return flat, rop, stream, plan

    def plan_all_reduce(self, array: Any, algorithm: str | None = None,
                        op: str | ReduceOp = "sum", tag: int = 0) -> Plan:
        """The :class:`~minidist.comm.planner.Plan` that ``all_reduce(array, op, algorithm,
        tag)`` runs: ``plan.algorithm`` names it ("auto" resolved), ``plan.reason`` says why.
        Not collective, sends nothing; ValueError for what ``all_reduce`` would refuse."""
        return self._planned(array, op, self.algorithm if algorithm is None else algorithm, tag)[3]

    # -- memory and lifecycle ----------------------------------------------------------------
    def farewell(self) -> None:
        """The last word before shutting down, called by ``destroy_process_group``: the
        queued async collectives finish, then each extension's ``farewell``, last attached
        first (the watch wing's compares collective counts with every rank)."""
        if self._worker is not None:
            self.drain()
        for ext in reversed(self.extensions):
            ext.farewell()

    def close(self) -> None:
        """Release the transport, the cached scratch buffers and what the extensions hold.
        Idempotent."""
        if self._worker is not None:
            self._worker.close()  # after the queued collectives (each has its own deadline)
            self._worker = None
        clear_scratch(self.transport)
        for ext in reversed(self.extensions):  # collective: e.g. IPC windows, before the
            ext.close()                        # transport closes
        self.transport.close()

    # -- async collectives and sub-groups ----------------------------------------------------
    def run_async(self, name: str, fn: Callable[[], Any], result: Any = None) -> Work:
        """Run ``fn`` (a collective of this group) on the group's worker thread, in submission
        order; return its Work. On a transport that is not ``thread_safe``, and in a one-rank
        group, ``fn`` runs here and now and the Work returned is already completed."""
        where = f"[rank {self.rank}/{self.size}]"
        if self.size == 1 or not self.transport.thread_safe:
            fn()
            return completed(name, where, result)
        if self._worker is None:
            self._worker = AsyncWorker(f"minidist-async-{self.backend}-{self.rank}")
        work = Work(name, where, result, self.transport.timeout_s)
        return self._worker.submit(work, fn)

    def drain(self) -> None:
        """Wait until the group's queued async collectives have finished (not on the worker)."""
        worker = self._worker
        if worker is not None and worker.pending:
            worker.drain()

    # -- the other collectives: functions of a group (collectives.py) ---------------------
    broadcast = collectives.broadcast
    reduce = collectives.reduce
    all_gather_into = collectives.all_gather_into
    all_gather = collectives.all_gather
    reduce_scatter = collectives.reduce_scatter
    barrier = collectives.barrier

    # -- beside the textbook: objects, sub-groups, buffers, what "auto" picks --------------
    broadcast_object = objects.broadcast_object
    all_gather_object = objects.all_gather_object
    new_group = subgroups.new_group
    alloc_buffer = group_shared_memory.alloc_buffer  # DDP's buckets (shared windows)
    free_buffer = group_shared_memory.free_buffer
    mpi_calls_ahead = group_shared_memory.mpi_calls_ahead
    auto_table = group_auto_choice.auto_table
    auto_source = group_auto_choice.auto_source
    use_calibration = group_auto_choice.use_calibration
    auto_choice = group_auto_choice.auto_choice

    def __repr__(self) -> str:
        return (f"ProcessGroup(backend={self.backend!r}, rank={self.rank}, size={self.size}, "
                f"algorithm={self.algorithm!r})")


def new_group_from_transport(transport: Transport, **kwargs: Any) -> ProcessGroup:
    """A ProcessGroup over ``transport`` (tests: one per thread of the threads transport)."""
    return ProcessGroup(transport, **kwargs)


__all__ = ["ProcessGroup", "new_group_from_transport"]
