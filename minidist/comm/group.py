"""ProcessGroup: a Transport plus the collectives, validated, planned, observed and run.

    group = ProcessGroup(transport)                 # any Transport: mpi, tcp, threads, local
    group.all_reduce(grad, op="sum")                # in place; algorithm="auto" by default
    group.plan_all_reduce(grad).algorithm           # what that runs ("auto" resolved)
    group.ledger.entries()[-1]                      # what this rank called last (the watch
                                                    # wing's ledger; None without it)

The module-level functions in ``minidist.comm.api`` (``all_reduce``, ``get_rank``, ...) call the
default group that ``init_process_group`` creates; tests build groups over the threads transport.
The other collectives (broadcast, all_gather, reduce_scatter, ``*_object``, ``new_group``) are
functions of a group in collectives.py; this module is the spine: ``all_reduce`` reads::

    validate on this rank (ValueError before any message: bad array, op, algorithm, tag)
    -> plan: planner.py, memoized per (algorithm, bytes, dtype, op, buffer kind): the algorithm
       that runs ("auto": the planner's chooser: ring in the spine alone, the auto wing's rules
       and calibration by default), why, and how to run it
    -> begin the call (calls.py): its number on its stream and its message tag (the call's
       fingerprint); the observers start watching
    -> run it; end the call. A CommError (timeout, peer failure, fingerprint mismatch) goes to
       ``calls.diagnose`` when a wing set one (the watch wing's failure diagnosis: every rank
       raises the same finding), else it is raised as it is

Extensions (``GROUP_EXTENSIONS``): a wing attaches to every new group here, in the order the
wings loaded, the same on every rank. Each returns an object whose ``farewell()`` runs at
``destroy_process_group`` and ``close()`` before the transport closes, last attached first::

    watch     the ledger and the other observers of every call (calls.py), the failure
              diagnosis (calls.diagnose), the transport's poll hook, the farewell count check
    fastpath  the node's shared memory (group.shared_memory); IPC windows freed at close
    auto      the planner's chooser and the calibration every rank holds alike

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

from minidist.comm import collectives
from minidist.comm.algorithms.scratch import clear as clear_scratch
from minidist.comm.calls import Call, Calls, CallSpec
from minidist.comm.errors import CommError
from minidist.comm.ops import SUPPORTED, ReduceOp
from minidist.comm.planner import Plan, Planner
from minidist.comm.topology import Topology, detect_topology
from minidist.comm.transports.base import Transport
from minidist.comm.validate import FAST_OPS, flat_view, reduce_op, stream_tag
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
            ``minidist.comm.algorithms.ALGORITHMS`` ("ring", "tree", "rd", "direct", and the
            fast-path wing's "mpi", "shm", "hier", "cuda_ipc").
        check_consistency: all-gather shapes/dtypes before each collective (debug mode; the
            watch wing's check); default ``MINIDIST_DEBUG >= 1``.
        backend: name for logs ("mpi", "tcp", "threads", "local").

    Attributes:
        topology: which ranks share a node (:class:`~minidist.comm.topology.Topology`).
        calls: call numbers, message tags and the observers of every collective (calls.py).
        ledger: the record of this rank's collectives (the watch wing's), else None.
        planner: which algorithm each all-reduce runs (planner.py).
        shared_memory: the node's shared memory when a wing set it up (the fast path's: MPI
            transport, every rank on one node), else None.
        extensions: what the wings attached to this group (``GROUP_EXTENSIONS``).

    Construction is collective on MPI and TCP: the ranks find their nodes (``topology``, a
    :class:`~minidist.comm.topology.Topology`), and the extensions may exchange messages too
    (the shared-memory node, the calibration every rank holds alike).
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

    def mpi_calls_ahead(self, peer: int) -> int:
        """The MPI collective call number ``peer`` has posted beyond this rank's, else 0
        (ranks on one node, MPI transport: the shared guard lines; elsewhere always 0)."""
        shared = self.shared_memory
        return shared.native_ahead(peer) if shared is not None else 0

    @contextlib.contextmanager
    def observed(self, spec: CallSpec, stream: int = 0, shape: Any = None) -> Iterator[Call]:
        """Run one collective (not all_reduce: it does the same inline) as a call: queued
        async collectives first (so the order on the wire is the program's), then the call
        numbered, tagged and shown to the observers; the block sends with ``call.tag``::

            with group.observed(call_spec("barrier", "barrier"), 0) as call:
                ...  # messages tagged call.tag

        A CommError in the block becomes the diagnosed error (every rank raises alike).
        """
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
                   tag: int = 0, label: str | None = None) -> Any:
        """Reduce ``array`` across ranks, in place; every rank gets identical bits.

        Args:
            array: C-contiguous, writable numpy/cupy array (float16/32/64, int32/64).
            op: "sum", "avg", "max", "min", "prod" or a ReduceOp. Integer AVG floors.
            algorithm: "auto" (the registry's usable algorithms by rule and cost model; "hier"
                on several nodes; "cuda_ipc" for device buffers on one node), or a name of
                ``minidist.comm.algorithms.ALGORITHMS``: "ring", "tree", "rd", "direct",
                "mpi", "shm", "hier", "cuda_ipc"; default the group's.
            tag: stream, ``0 <= tag < 1024``; concurrent collectives (threads) need distinct
                tags.
            label: a caller's note kept in this call's ledger entry (e.g. "bucket=3");
                default the enclosing ``ledger_label``. An explicit label is part of the
                call's fingerprint: ranks that pass different ones raise CollectiveMismatch.

        Returns:
            ``array`` itself (torch returns None; returning the buffer allows chaining).

        Raises:
            ValueError: bad argument on this rank (nothing was sent).
            CollectiveMismatch: ranks called different collectives here (found by fingerprints
                or the ledger comparison; the message names the call and the ranks).
            CommTimeout: a deadline passed (the message says which rank differed, if any);
                CommError: a peer failed.
        """
        algorithm = self.algorithm if algorithm is None else algorithm
        flat, rop, stream = self._check_all_reduce(array, op, algorithm, tag)  # 1. validate
        if self._worker is not None:  # queued async collectives first (see observed)
            self.drain()
        plan = self.planner.plan(algorithm, flat, rop, stream)  # 2. plan (memoized per shape)
        call = self.calls.begin(plan.spec, stream, array.shape, label)  # 3. number, tag, watch
        try:
            plan.run(flat, rop, call.tag)  # 4. run
        except CommError as e:
            raise self.calls.failed(call, e) from e  # diagnosed: every rank raises alike
        self.calls.end(call)
        return array

    def _check_all_reduce(self, array: Any, op: Any, algorithm: str, tag: Any) -> tuple:
        """``(flat view, ReduceOp, stream)`` of an all_reduce call, or ValueError."""
        try:
            rop: ReduceOp = FAST_OPS[op]
        except (KeyError, TypeError):
            rop = reduce_op(self, op, f'all_reduce(algorithm="{algorithm}")')
        flags = array.flags if type(array) is np.ndarray else None  # the hot path: a bucket
        if flags is not None and flags.carray and array.ndim == 1 and array.dtype in SUPPORTED:
            flat = array  # (carray: C-contiguous, aligned and writable)
        else:  # any other array, checked (no formatting unless bad)
            flat = flat_view(self, array, f'all_reduce(algorithm="{algorithm}")')
        if tag:
            tag = stream_tag(self, tag, f'all_reduce(algorithm="{algorithm}")')
        return flat, rop, tag

    def plan_all_reduce(self, array: Any, algorithm: str | None = None,
                        op: str | ReduceOp = "sum", tag: int = 0) -> Plan:
        """The :class:`~minidist.comm.planner.Plan` that ``all_reduce(array, op, algorithm,
        tag)`` runs: ``plan.algorithm`` names it ("auto" resolved, with the calibration),
        ``plan.reason`` says why. Not collective, sends nothing.

        Raises:
            ValueError: a bad array, op, algorithm or tag (as ``all_reduce`` would).
        """
        algorithm = self.algorithm if algorithm is None else algorithm
        flat, rop, tag = self._check_all_reduce(array, op, algorithm, tag)
        return self.planner.plan(algorithm, flat, rop, tag)

    # -- auto, explained ---------------------------------------------------------------------
    def auto_table(self) -> dict:
        """What ``algorithm="auto"`` will pick on this group at every power-of-two size.

        JSON-able (the chooser's ``table``; the auto wing's says whether a calibration or the
        shipped table decides), plus the group's backend and transport; not collective (the
        shared-memory facts and the calibration were settled when the group was made).
        """
        return {"backend": self.backend, "transport": self.transport.name,
                "num_nodes": self.topology.num_nodes, **self.planner.chooser.table()}

    def auto_source(self) -> str:
        """Which table ``algorithm="auto"`` uses on this group: ``"calibration <file>"`` (a
        ``python -m minidist.tune`` result every rank holds) or the shipped table."""
        return self.planner.chooser.source()

    def use_calibration(self, calibration: Any) -> None:
        """Make "auto" on this group use ``calibration`` (a ``calibrate.Calibration``; None:
        the shipped table). Every rank must pass the same one, as ``calibrate`` returns it."""
        self.planner.chooser.use_calibration(calibration)

    def auto_choice(self, array: Any) -> tuple[str, str]:
        """``(algorithm, reason)``: what ``all_reduce(array)`` with "auto" runs, and why; not
        collective, sends nothing."""
        flat = flat_view(self, array, "auto_choice", writable=False)
        plan = self.planner.plan("auto", flat, ReduceOp.SUM)
        return plan.algorithm, plan.reason

    # -- memory and lifecycle ----------------------------------------------------------------
    def farewell(self) -> None:
        """The last word before shutting down, called by ``destroy_process_group``: the
        queued async collectives finish, then each extension's ``farewell``, last attached
        first (the watch wing's compares collective counts with every rank and raises
        CollectiveMismatch when a rank made fewer or more collectives than the others)."""
        if self._worker is not None:
            self.drain()
        for ext in reversed(self.extensions):
            ext.farewell()

    def close(self) -> None:
        """Release the transport, the cached scratch buffers and what the extensions hold
        (the watch wing writes the ledger here: ``MINIDIST_LEDGER_DUMP``). Idempotent."""
        if self._worker is not None:
            self._worker.close()  # after the queued collectives (each has its own deadline)
            self._worker = None
        clear_scratch(self.transport)
        for ext in reversed(self.extensions):  # collective: e.g. IPC windows, before the
            ext.close()                        # transport closes
        self.transport.close()

    # -- async collectives and sub-groups ----------------------------------------------------
    def run_async(self, name: str, fn: Callable[[], Any], result: Any = None) -> Work:
        """Run ``fn`` (a collective of this group) on the group's worker thread; return its Work.

        Collectives run in the order they were submitted, and every synchronous collective of
        the group waits for them first (comm/work.py). On a transport that is not
        ``thread_safe`` (MPI without MPI_THREAD_MULTIPLE), and in a one-rank group, ``fn`` runs
        here and now and the Work returned is already completed (an error raises at the call).
        """
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

    # -- the other collectives: functions of a group (collectives.py) -----------------------
    broadcast = collectives.broadcast
    reduce = collectives.reduce
    all_gather_into = collectives.all_gather_into
    all_gather = collectives.all_gather
    reduce_scatter = collectives.reduce_scatter
    barrier = collectives.barrier
    broadcast_object = collectives.broadcast_object
    all_gather_object = collectives.all_gather_object
    alloc_buffer = collectives.alloc_buffer
    free_buffer = collectives.free_buffer
    new_group = collectives.new_group

    def __repr__(self) -> str:
        return (f"ProcessGroup(backend={self.backend!r}, rank={self.rank}, size={self.size}, "
                f"algorithm={self.algorithm!r})")


def new_group_from_transport(transport: Transport, **kwargs: Any) -> ProcessGroup:
    """A ProcessGroup over ``transport`` (tests: one per thread of the threads transport)."""
    return ProcessGroup(transport, **kwargs)


__all__ = ["ProcessGroup", "new_group_from_transport"]
