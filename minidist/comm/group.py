"""ProcessGroup: a Transport plus the collectives, validated, recorded and dispatched.

    group = ProcessGroup(transport)                 # any Transport: mpi, tcp, threads, local
    group.all_reduce(grad, op="sum")                # in place; algorithm="auto" by default
    group.plan_all_reduce(grad).algorithm           # what that runs ("auto" resolved)
    group.ledger.entries()[-1]                      # what this rank called last (ledger.py)

The module-level functions in ``minidist.comm.api`` (``all_reduce``, ``get_rank``, ...) call the
default group that ``init_process_group`` creates; tests build groups over the threads transport.
The other collectives (broadcast, all_gather, reduce_scatter, ``*_object``, ``new_group``) live
in collectives.py; this module is the spine: ``all_reduce`` reads as validate, plan, run::

    validate on this rank (ValueError before any message: bad array, op, algorithm, tag)
    -> plan: planner.py, memoized per (algorithm, bytes, dtype, op, buffer kind): the algorithm
       that runs ("auto": select.py's rules with the calibration), why, its function
    -> run under the ledger: ``claim`` the call number and message tag (the call's fingerprint)
       before the first message, ``record`` the row (on MPI's own Allreduce: while the data is
       in flight), run; a CommError (timeout, peer failure, fingerprint mismatch) goes to
       failure/exchange.py: the ranks exchange ledgers and every rank raises the same finding

Streams: ``tag`` (0 <= tag < MAX_STREAMS = 1024) names an independent stream with its own call
numbers, for collectives that run concurrently from different threads; one stream must be used
by one thread at a time. Async collectives (``run_async``; comm/work.py): one worker thread
per group runs them in issue order; every synchronous collective of the group first waits for
the queued ones (drain), so all ranks still make the group's collectives in program order.
Debug mode (``check_consistency``): diagnosis/consistency.py.
"""

from __future__ import annotations

from time import perf_counter
from typing import Any, Callable

import numpy as np

from minidist.comm.algorithms import select as _select
from minidist.comm.algorithms.calibrate import agreed as agreed_calibration
from minidist.comm.algorithms.scratch import clear as clear_scratch
from minidist.comm.algorithms.select import Explainer
from minidist.comm.algorithms.shm import shm_available, shm_node
from minidist.comm.collectives import Collectives
from minidist.comm.diagnosis.consistency import check_agreement
from minidist.comm.failure import FailurePolicy
from minidist.comm.failure.exchange import farewell, on_failure, poll
from minidist.comm.diagnosis.ledger import (T0, T1, TAG, Ledger, dump_dir, ledger_capacity,
                                            ledger_enabled)
from minidist.comm.errors import CommError
from minidist.comm.ops import SUPPORTED, SUPPORTED_DTYPES, ReduceOp, parse_op
from minidist.comm.planner import Plan, Planner
from minidist.comm.topology import Topology, detect_topology
from minidist.comm.transports.base import MAX_STREAMS, Transport
from minidist.comm.work import AsyncWorker, Work, completed
from minidist.logger import debug_level, get_logger

log = get_logger(__name__)

_OPS = list(ReduceOp)
_FAST_OPS: dict = {**{o.value: o for o in ReduceOp}, **{o: o for o in ReduceOp}}


class ProcessGroup(Collectives):
    """The ranks of one transport and the collectives over them.

    Args:
        transport: moves the bytes (``rank`` and ``size`` come from it).
        algorithm: default all-reduce algorithm ("auto", "ring", "tree", "rd", "direct", "mpi",
            "shm", "hier").
        check_consistency: all-gather shapes/dtypes before each collective (debug mode);
            default ``MINIDIST_DEBUG >= 1``.
        backend: name for logs ("mpi", "tcp", "threads", "local").

    Attributes:
        topology: which ranks share a node (:class:`~minidist.comm.topology.Topology`).

    Construction is collective on MPI and TCP: the ranks find their nodes (``topology``, a
    :class:`~minidist.comm.topology.Topology`); on the MPI transport with every rank on one
    node it also sets up the shared-memory node (the "shm" algorithm and the fingerprint guard
    of MPI's Allreduce). With ranks on several nodes, ``auto`` runs "hier".
    """

    def __init__(self, transport: Transport, algorithm: str = "auto",
                 check_consistency: bool | None = None, backend: str | None = None) -> None:
        self.transport = transport
        self.rank, self.size = transport.rank, transport.size
        self.algorithm = algorithm
        self.backend = backend or transport.name
        self.check_consistency = (debug_level() >= 1 if check_consistency is None
                                  else check_consistency)
        self._debug = debug_level()
        self._max_tag = int(transport.max_tag)
        self.ledger = Ledger(self.rank, self.size, ledger_capacity(), ledger_enabled(),
                             self._max_tag)
        self.topology: Topology = detect_topology(transport)  # collective (MPI, TCP)
        self._shm = (shm_node(transport) if self.topology.is_single_node()
                     and shm_available(transport) else None)  # collective
        self._explainer = Explainer(self.size)  # MINIDIST_DEBUG: auto, once per size class
        # peer -> its final collective counts per stream, from its farewell (SIDE_BYE)
        self.farewells: dict[int, dict[int, int]] = {}
        self.exit_codes: dict[int, int] = {}  # peer -> its exit code, if it left (failure/leaving.py)
        self._token = np.zeros(1, np.uint8)
        self._token_in = np.zeros(1, np.uint8)
        self._worker: AsyncWorker | None = None  # started by the first run_async
        # what this rank does when it or a peer fails (comm/failure/policy.py)
        self.failure_policy = FailurePolicy()
        transport.poll_hook = self._poll
        # auto's table: a calibration every rank holds alike (collective), else the shipped one
        self.planner = Planner(transport, self.topology.num_nodes, self._shm, None)
        self.use_calibration(agreed_calibration(self))
        if self._debug >= 1:
            log.debug("auto uses the %s (n=%d, transport %s)", self.auto_source(), self.size,
                      transport.name)

    # -- helpers -----------------------------------------------------------------------------
    def where(self, call: str) -> str:
        """``"[rank r/N] call"``: how every message about ``call`` on this group begins."""
        return f"[rank {self.rank}/{self.size}] {call}"

    def mpi_calls_ahead(self, peer: int) -> int:
        """The MPI collective call number ``peer`` has posted beyond this rank's, else 0
        (ranks on one node, MPI transport: the shared guard lines; elsewhere always 0)."""
        return self._shm.native_ahead(peer) if self._shm is not None else 0

    def _flat(self, array: Any, call: str, writable: bool = True, algorithm: str | None = None
              ) -> Any:
        """Validate ``array`` and return a flat view of it (never a copy).

        ``algorithm``: for all_reduce, whose call is spelled out only in an error message.
        """
        if algorithm is not None:
            call = f'{call}(algorithm="{algorithm}")'
        if not hasattr(array, "dtype") or not hasattr(array, "flags"):
            raise ValueError(f"{self.where(call)}: expected a numpy or cupy array, got "
                             f"{type(array).__name__}. Wrap the data with np.asarray(...) first.")
        if array.dtype not in SUPPORTED:
            raise ValueError(f"{self.where(call)}: dtype {array.dtype.name} is not supported; "
                             f"use one of {', '.join(SUPPORTED_DTYPES)} "
                             "(e.g. .astype(np.float32)).")
        if not array.flags.c_contiguous:
            raise ValueError(f"{self.where(call)}: the array (shape {tuple(array.shape)}, strides "
                             f"{tuple(array.strides)}) is not C-contiguous, so it cannot be "
                             "reduced in place. Pass np.ascontiguousarray(x) and copy the result back.")
        if writable and not getattr(array.flags, "writeable", True):
            raise ValueError(f"{self.where(call)}: the array is read-only (flags.writeable is "
                             "False) but the result is written into it. Pass a writable copy "
                             "(x.copy()).")
        return array.reshape(-1)

    def _root(self, root: int, name: str, call: str) -> int:
        if isinstance(root, bool) or not isinstance(root, (int, np.integer)) or \
                not 0 <= root < self.size:
            raise ValueError(f"{self.where(call)}: {name}={root!r} is out of range; it must be "
                             f"a rank in [0, {self.size}).")
        return int(root)

    def _op(self, op: Any, call: str) -> ReduceOp:
        try:
            return _FAST_OPS[op]
        except (KeyError, TypeError):
            pass
        try:
            return parse_op(op)
        except ValueError as e:
            raise ValueError(f"{self.where(call)}: {e}.") from None

    def _stream(self, tag: Any, call: str) -> int:
        if isinstance(tag, bool) or not isinstance(tag, (int, np.integer)) or \
                not 0 <= tag < MAX_STREAMS:
            raise ValueError(f"{self.where(call)}: tag={tag!r} is out of range; a stream tag "
                             f"must be an integer in [0, {MAX_STREAMS}).")
        return int(tag)

    def _begin(self, collective: str, stream: int, flat: Any, shape: Any, op: ReduceOp | None,
               root: int, algorithm: str, reason: str | None) -> tuple:
        """``(row, message tag)`` of a call that is not all_reduce (the ledger's slower path).

        Every such call comes here before its first message: queued async collectives of the
        group run first (drain), so the order on the wire is the program's order.
        """
        if self._worker is not None:
            self._drain()
        if not self.ledger.enabled:
            return None, stream
        count, dtype = (0, None) if flat is None else (flat.size, flat.dtype)
        row = self.ledger.begin(collective, stream, count, dtype, shape, op, root, algorithm,
                                reason)
        return row, row[TAG]

    def _failed(self, row: list | None, error: CommError, call: str) -> CommError:
        return on_failure(self, row, error, call)

    def _poll(self, src: int | None, tag: int) -> CommError | None:
        """The transport's poll hook: why a slow wait cannot succeed (failure.poll)."""
        return poll(self, src, tag)

    # -- collectives on arrays ---------------------------------------------------------------
    def all_reduce(self, array: Any, op: str | ReduceOp = "sum", algorithm: str | None = None,
                   tag: int = 0, label: str | None = None) -> Any:
        """Reduce ``array`` across ranks, in place; every rank gets identical bits.

        Args:
            array: C-contiguous, writable numpy/cupy array (float16/32/64, int32/64).
            op: "sum", "avg", "max", "min", "prod" or a ReduceOp. Integer AVG floors.
            algorithm: "auto" (cost model; "hier" on several nodes; "cuda_ipc" for device
                buffers on one node), "ring", "tree", "rd", "direct", "mpi", "shm", "hier" or
                "cuda_ipc"; default the group's.
            tag: stream, ``0 <= tag < 1024``; concurrent collectives (threads) need distinct
                tags.
            label: a caller's note kept in this call's ledger entry (e.g. "bucket=3");
                default the enclosing ``ledger_label``.

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
        flat, rop, tag = self._check_all_reduce(array, op, algorithm, tag)  # 1. validate
        if self._worker is not None:  # queued async collectives first (see _begin)
            self._drain()
        plan = self.planner.plan(algorithm, flat, rop, tag)  # 2. plan (memoized per shape)
        self._run_all_reduce(plan, flat, rop, tag, array.shape, label, algorithm)  # 3. run
        return array

    def _check_all_reduce(self, array: Any, op: Any, algorithm: str, tag: Any) -> tuple:
        """``(flat view, ReduceOp, stream)`` of an all_reduce call, or ValueError."""
        try:
            rop: ReduceOp = _FAST_OPS[op]
        except (KeyError, TypeError):
            rop = self._op(op, f'all_reduce(algorithm="{algorithm}")')
        flags = array.flags if type(array) is np.ndarray else None  # the hot path: a bucket
        if (flags is not None and array.ndim == 1 and array.dtype in SUPPORTED
                and flags.c_contiguous and flags.writeable):
            flat = array
        else:  # any other array, checked (no formatting unless bad)
            flat = self._flat(array, "all_reduce", algorithm=algorithm)
        if tag:
            tag = self._stream(tag, f'all_reduce(algorithm="{algorithm}")')
        return flat, rop, tag

    def _run_all_reduce(self, plan: Plan, flat: Any, op: ReduceOp, tag: int, shape: Any,
                        label: str | None, algorithm: str) -> None:
        """Run ``plan`` on ``flat`` under the ledger (module docstring: claim, record, run).

        A CommError goes to the diagnosis (``on_failure``): every rank raises the same finding.
        The ledger row names the caller of ``all_reduce``: 3 frames up from ``record``.
        """
        ledger = self.ledger
        row = None
        if ledger.enabled:
            seq, wire = ledger.claim(tag, plan.call[0])
        else:
            wire = tag
        if self._debug >= 1:
            log.debug("all_reduce: %s ran %s on %d x %s (%d bytes, op=%s, n=%d)", algorithm,
                      plan.algorithm, flat.size, flat.dtype.name, flat.nbytes, op.value,
                      self.size)
        t0 = perf_counter()
        try:
            if plan.native is not None and not self.check_consistency:
                # MPI's Allreduce: post it, write the ledger row while the data moves, wait.
                req = plan.native.post(flat, op, wire)
                if ledger.enabled:
                    row = ledger.record(seq, wire, t0, tag, shape, label, plan.call, 3)
                plan.native.wait(req, flat, op, wire)
            else:
                if ledger.enabled:
                    row = ledger.record(seq, wire, t0, tag, shape, label, plan.call, 3)
                if self.check_consistency:
                    check_agreement(self, f'all_reduce(algorithm="{algorithm}")', flat, op,
                                    algorithm, 0, row, tag)
                if plan.stager is not None:  # chunks copied down, reduced on the host, up
                    plan.stager.all_reduce(flat, lambda chunk: plan.run(self.transport, chunk,
                                                                        op, wire))
                else:
                    plan.run(self.transport, flat, op, wire)
        except CommError as e:
            if row is None and ledger.enabled:  # posting failed before the row was written
                row = ledger.record(seq, wire, t0, tag, shape, label, plan.call, 3)
            raise self._failed(row, e, f'all_reduce(algorithm="{algorithm}")') from e
        if row is not None:
            row[T1] = perf_counter()
            if self._debug and algorithm == "auto":
                self._explainer.add(plan.algorithm, plan.reason, flat.nbytes,
                                    self.planner.is_shared(flat, tag), row[T1] - row[T0])

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

        JSON-able (see ``select.table``: its ``source`` says whether a calibration or the
        shipped table decides), plus the group's backend and transport; not collective (the
        shared-memory facts and the calibration were settled when the group was made).
        """
        return {"backend": self.backend, "transport": self.transport.name,
                "num_nodes": self.topology.num_nodes, **self.planner.table()}

    def auto_source(self) -> str:
        """Which table ``algorithm="auto"`` uses on this group: ``"calibration <file>"`` (a
        ``python -m minidist.tune`` result every rank holds) or the shipped table."""
        return _select.source(self.planner.calibration)

    def use_calibration(self, calibration: Any) -> None:
        """Make "auto" on this group use ``calibration`` (a ``calibrate.Calibration``; None:
        the shipped table). Every rank must pass the same one, as ``calibrate`` returns it."""
        self.planner.use_calibration(calibration)
        self._explainer.calibration = calibration

    def auto_choice(self, array: Any) -> tuple[str, str]:
        """``(algorithm, reason)``: what ``all_reduce(array)`` with "auto" runs, and why; not
        collective, sends nothing."""
        flat = self._flat(array, "auto_choice", writable=False)
        plan = self.planner.plan("auto", flat, ReduceOp.SUM)
        return plan.algorithm, plan.reason

    # -- memory and lifecycle ----------------------------------------------------------------
    def farewell(self) -> None:
        """Compare collective counts with every rank before shutting down (failure.farewell).

        Called by ``destroy_process_group``; raises CollectiveMismatch when a rank made fewer or
        more collectives than the others.
        """
        self._explainer.flush()
        if self._worker is not None:
            self._drain()
        farewell(self)

    def close(self) -> None:
        """Write the ledger (``MINIDIST_LEDGER_DUMP``), release the transport and the cached
        scratch buffers. Idempotent."""
        if self._worker is not None:
            self._worker.close()  # after the queued collectives (each has its own deadline)
            self._worker = None
        d = dump_dir()
        if d and self.ledger.enabled:
            try:
                self.ledger.dump(d)
            except OSError as e:
                log.warning("could not write the ledger to %s: %s", d, e)
        clear_scratch(self.transport)
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

    def _drain(self) -> None:
        """Wait until the group's queued async collectives have finished (not on the worker)."""
        worker = self._worker
        if worker is not None and worker.pending:
            worker.drain()

    def __repr__(self) -> str:
        return (f"ProcessGroup(backend={self.backend!r}, rank={self.rank}, size={self.size}, "
                f"algorithm={self.algorithm!r})")


def new_group_from_transport(transport: Transport, **kwargs: Any) -> ProcessGroup:
    """A ProcessGroup over ``transport`` (tests: one per thread of the threads transport)."""
    return ProcessGroup(transport, **kwargs)


__all__ = ["ProcessGroup", "new_group_from_transport"]
