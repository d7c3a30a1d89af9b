"""ProcessGroup: a Transport plus the collectives, validated, recorded and dispatched.

    group = ProcessGroup(transport)                 # any Transport: mpi, tcp, threads, local
    group.all_reduce(grad, op="sum")                # in place; algorithm="auto" by default
    group.broadcast(weights, src=0)
    out = group.all_gather(x)                       # shape (world_size, *x.shape)
    group.reduce_scatter(out_chunk, full, op="avg") # rank r gets chunk r of the reduction
    names = group.all_gather_object({"host": h})    # small JSON-able values, no pickle
    group.ledger.entries()[-1]                      # what this rank called last (ledger.py)

The module-level functions in ``minidist.comm.api`` (``all_reduce``, ``get_rank``, ...) call the
default group that ``init_process_group`` creates; tests build groups over the threads transport.

Every collective takes the same path, the one choke point of the ledger::

    validate on this rank (ValueError before any message: bad array, op, algorithm, root, tag)
    -> resolve the algorithm (auto: select.py, with its reason)
    -> ledger.begin: call number on the stream, fingerprint -> message tag (wire_tag)
    -> run it; a CommError (timeout, peer failure, fingerprint mismatch) goes to
       failure.on_failure: the ranks exchange ledgers and every rank raises the same finding
    -> ledger row marked ok

``all_reduce`` takes a faster form of the same path, for the small messages where Python is
most of the time: its plan (algorithm, reason, function, the fingerprint's fixed part) is
memoized per (algorithm, bytes, dtype, op, buffer kind), the ledger's ``begin`` is split into
``claim`` (call number and message tag, before the first message) and ``record`` (the row),
and on MPI's own Allreduce the row is written while the data is in flight (post, record,
wait).

Streams: ``tag`` (0 <= tag < MAX_STREAMS = 1024) names an independent stream with its own call
numbers, for collectives that run concurrently from different threads; one stream must be used
by one thread at a time. ``barrier`` and the ``*_object`` collectives use stream 0.

Async collectives (``run_async``; comm/work.py): one worker thread per group runs them in issue
order; every synchronous collective of the group first waits for the queued ones (drain), so
all ranks still make the group's collectives in program order.

Sub-groups (``new_group``): the transport's ``split`` (MPI: ``MPI_Comm_split``; elsewhere a
``SubgroupTransport`` view with its own tag space) under a new ProcessGroup.

Arrays that differ across ranks are caught by the fingerprints (a different count, dtype, op,
root or collective never matches); with ``check_consistency=True`` (default:
``MINIDIST_DEBUG>=1``) each collective also all-gathers (numel, dtype, op, algorithm, root)
first and raises CollectiveMismatch naming the rank that differs, before any data moves.
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable

import numpy as np

from minidist import xp as backend
from minidist.comm.algorithms import ALGORITHMS, cuda_ipc_available
from minidist.comm.algorithms import select as _select
from minidist.comm.algorithms.calibrate import agreed as agreed_calibration
from minidist.comm.algorithms.mpi_native import mpi_all_reduce, supports_native
from minidist.comm.algorithms.ring import ring_all_gather, ring_reduce_scatter
from minidist.comm.algorithms.scratch import clear as clear_scratch
from minidist.comm.algorithms.scratch import scratch
from minidist.comm.algorithms.select import Explainer, choose_for_nodes, choose_with_reason
from minidist.comm.algorithms.select import table as select_table
from minidist.comm.algorithms.shm import _owners, shm_alloc_buffer, shm_available, shm_node
from minidist.comm.algorithms.tree import tree_broadcast, tree_reduce
from minidist.comm.errors import CollectiveMismatch, CommError
from minidist.comm.failure import farewell, on_failure, poll
from minidist.comm.ledger import (SEQ, T0, T1, TAG, Ledger, dump_dir, fingerprint, ledger_capacity,
                                  call_plan, ledger_enabled)
from minidist.comm.ops import SUPPORTED, SUPPORTED_DTYPES, ReduceOp, finalize, parse_op
from minidist.comm.staging import stager_for
from minidist.comm.topology import Topology, detect_topology
from minidist.comm.transports.base import MAX_STREAMS, Transport, wire_tag
from minidist.comm.transports.shm_window import shm_free_buffer
from minidist.comm.work import AsyncWorker, Work, completed
from minidist.log import debug_level, get_logger

log = get_logger(__name__)

_OPS = list(ReduceOp)
_FAST_OPS: dict = {**{o.value: o for o in ReduceOp}, **{o: o for o in ReduceOp}}


class ProcessGroup:
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
        self._native = supports_native(transport)
        self.topology: Topology = detect_topology(transport)  # collective (MPI, TCP)
        self._nodes = self.topology.num_nodes  # auto on several nodes: choose_for_nodes
        self._shm = (shm_node(transport) if self.topology.is_single_node()
                     and shm_available(transport) else None)  # collective
        self._explainer = Explainer(self.size)  # MINIDIST_DEBUG: auto, once per size class
        self._plans: dict = {}  # all_reduce: (algorithm, nbytes, dtype, op, shared) -> plan
        self._plan_epoch = _select.EPOCH
        self._byes: dict[int, dict[int, int]] = {}  # peer -> its final counts (SIDE_BYE)
        self._exit_codes: dict[int, int] = {}  # peer -> its exit code, if it left (leaving.py)
        self._token = np.zeros(1, np.uint8)
        self._token_in = np.zeros(1, np.uint8)
        self._worker: AsyncWorker | None = None  # started by the first run_async
        transport.poll_hook = self._poll
        # auto's table: a calibration every rank holds alike (collective), else the shipped one
        self._calibration = self._explainer.calibration = agreed_calibration(self)
        if self._debug >= 1:
            log.debug("auto uses the %s (n=%d, transport %s)", _select.source(self._calibration),
                      self.size, transport.name)

    # -- helpers -----------------------------------------------------------------------------
    def _where(self, call: str) -> str:
        return f"[rank {self.rank}/{self.size}] {call}"

    def _flat(self, array: Any, call: str, writable: bool = True, algorithm: str | None = None
              ) -> Any:
        """Validate ``array`` and return a flat view of it (never a copy).

        ``algorithm``: for all_reduce, whose call is spelled out only in an error message.
        """
        if type(array) is np.ndarray:  # the hot path: one flags object, no reshape if 1-D
            flags = array.flags
            if array.dtype in SUPPORTED and flags.c_contiguous and (flags.writeable
                                                                    or not writable):
                return array if array.ndim == 1 else array.reshape(-1)
        if algorithm is not None:
            call = f'{call}(algorithm="{algorithm}")'
        if not hasattr(array, "dtype") or not hasattr(array, "flags"):
            raise ValueError(f"{self._where(call)}: expected a numpy or cupy array, got "
                             f"{type(array).__name__}. Wrap the data with np.asarray(...) first.")
        if array.dtype not in SUPPORTED:
            raise ValueError(f"{self._where(call)}: dtype {array.dtype.name} is not supported; "
                             f"use one of {', '.join(SUPPORTED_DTYPES)} "
                             "(e.g. .astype(np.float32)).")
        if not array.flags.c_contiguous:
            raise ValueError(f"{self._where(call)}: the array (shape {tuple(array.shape)}, strides "
                             f"{tuple(array.strides)}) is not C-contiguous, so it cannot be "
                             "reduced in place. Pass np.ascontiguousarray(x) and copy the result back.")
        if writable and not getattr(array.flags, "writeable", True):
            raise ValueError(f"{self._where(call)}: the array is read-only (flags.writeable is "
                             "False) but the result is written into it. Pass a writable copy "
                             "(x.copy()).")
        return array.reshape(-1)

    def _root(self, root: int, name: str, call: str) -> int:
        if isinstance(root, bool) or not isinstance(root, (int, np.integer)) or \
                not 0 <= root < self.size:
            raise ValueError(f"{self._where(call)}: {name}={root!r} is out of range; it must be "
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
            raise ValueError(f"{self._where(call)}: {e}.") from None

    def _stream(self, tag: Any, call: str) -> int:
        if isinstance(tag, bool) or not isinstance(tag, (int, np.integer)) or \
                not 0 <= tag < MAX_STREAMS:
            raise ValueError(f"{self._where(call)}: tag={tag!r} is out of range; a stream tag "
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

    def _agree(self, call: str, flat: Any, op: ReduceOp | None, algo: str, root: int,
               row: list | None, stream: int) -> None:
        """Debug mode: all-gather (numel, dtype, op, algorithm, root) and compare with rank 0."""
        if not self.check_consistency or self.size == 1:
            return
        fields = ("numel", "dtype", "op", "algorithm", "root")
        algos = tuple(dict.fromkeys(("auto", *ALGORITHMS, "dissemination")))
        mine = [flat.size, SUPPORTED_DTYPES.index(flat.dtype.name),
                -1 if op is None else _OPS.index(op),
                algos.index(algo) if algo in algos else len(algos), root]
        table = np.zeros(self.size * len(mine), np.int64)
        table[self.rank * len(mine):(self.rank + 1) * len(mine)] = mine
        check = (fingerprint(row[SEQ], "consistency_check", None, None, 0, -1, None)
                 if row is not None else 1)
        ring_all_gather(self.transport, table, wire_tag(stream, check, self._max_tag))
        rows = table.reshape(self.size, len(mine))
        for r in range(1, self.size):
            diff = [i for i in range(len(mine)) if rows[r, i] != rows[0, i]]
            if diff:
                i = diff[0]
                shows: dict[int, Callable[[int], str]] = {
                    0: lambda v: f"{v} elements", 1: lambda v: SUPPORTED_DTYPES[v],
                    2: lambda v: _OPS[v].value if v >= 0 else "-",
                    3: lambda v: algos[v] if v < len(algos) else "?", 4: str}
                show = shows[i]
                err = CollectiveMismatch(
                    f"{self._where(call)}: rank {r} passed {fields[i]}={show(int(rows[r, i]))} "
                    f"but rank 0 passed {fields[i]}={show(int(rows[0, i]))}. Every rank must pass "
                    "the same shape, dtype, op and algorithm; check that all ranks build the same "
                    "model and call the same collectives in the same order.")
                err.diagnosis = {"kind": "mismatch", "rank": r, "field": fields[i]}
                raise err

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
        try:
            rop: ReduceOp = _FAST_OPS[op]
        except (KeyError, TypeError):
            rop = self._op(op, f'all_reduce(algorithm="{algorithm}")')
        flat = self._flat(array, "all_reduce", algorithm=algorithm)  # no formatting unless bad
        if tag:
            tag = self._stream(tag, f'all_reduce(algorithm="{algorithm}")')
        if self._worker is not None:  # queued async collectives first (see _begin)
            self._drain()
        shared = False
        if algorithm == "auto":
            shm = self._shm if type(flat) is np.ndarray and not tag else None  # shm: stream 0
            shared = shm is not None and bool(shm.user_windows) and id(flat.base) in _owners(shm)
        # The plan of this call shape (memoized: a training loop repeats a few shapes):
        # (algorithm that runs, why, its function, the ledger's call plan, MPI's Allreduce?)
        if self._plan_epoch != _select.EPOCH:  # the model or rules changed (load_model, tune)
            self._plans.clear()
            self._plan_epoch = _select.EPOCH
        plan = self._plans.get((algorithm, flat.nbytes, flat.dtype, rop.code, shared, not tag,
                                type(flat)))
        if plan is None:
            plan = self._plan(algorithm, flat, rop, shared, tag)
        name, reason, fn, call, native = plan
        ledger = self.ledger
        row = None
        if ledger.enabled:
            seq, wire = ledger.claim(tag, call[0])
        else:
            wire = tag
        if self._debug >= 1:
            log.debug("all_reduce: %s ran %s on %d x %s (%d bytes, op=%s, n=%d)", algorithm,
                      name, flat.size, flat.dtype.name, flat.nbytes, rop.value, self.size)
        stager = stager_for(self.transport, flat, fn)  # device buffer, MPI not CUDA-aware
        t0 = time.perf_counter()
        try:
            if native and not self.check_consistency and stager is None:
                # MPI's Allreduce: post it, write the ledger row while the data moves, wait.
                pending = self.transport.native_post(flat, rop, wire)
                if ledger.enabled:
                    row = ledger.record(seq, wire, t0, tag, array.shape, label, call)
                self.transport.native_wait(pending)
            else:
                if ledger.enabled:
                    row = ledger.record(seq, wire, t0, tag, array.shape, label, call)
                if self.check_consistency:
                    self._agree(f'all_reduce(algorithm="{algorithm}")', flat, rop, algorithm, 0,
                                row, tag)
                if stager is not None:  # chunks copied down, reduced on the host, copied up
                    stager.all_reduce(flat, lambda chunk: fn(self.transport, chunk, rop, wire))
                else:
                    fn(self.transport, flat, rop, wire)
        except CommError as e:
            if row is None and ledger.enabled:  # posting failed before the row was written
                row = ledger.record(seq, wire, t0, tag, array.shape, label, call)
            raise self._failed(row, e, f'all_reduce(algorithm="{algorithm}")') from e
        if row is not None:
            row[T1] = time.perf_counter()
            if self._debug and algorithm == "auto":
                self._explainer.add(name, reason, flat.nbytes, shared, row[T1] - row[T0])
        return array

    def _plan(self, algorithm: str, flat: Any, op: ReduceOp, shared: bool, tag: int = 0) -> tuple:
        """``(name, reason, fn, ledger.call_plan, native)`` of an all-reduce of this shape on
        stream ``tag``; validates ``algorithm`` (ValueError before anything is sent) and
        memoizes the plan."""
        by_nodes = choose_for_nodes(self._nodes, flat.nbytes) if algorithm == "auto" else None
        if by_nodes is not None:  # several nodes: hier (or rd for small messages)
            name, reason = by_nodes
            fn = ALGORITHMS[name]
        elif algorithm == "auto" and cuda_ipc_available(self.transport, flat, tag):
            name, reason = "cuda_ipc", "device buffer, ranks on one node: CUDA IPC windows"
            fn = ALGORITHMS[name]
        elif algorithm == "auto":
            shm = self._shm if type(flat) is np.ndarray and not tag else None  # shm: stream 0
            name, reason = choose_with_reason(self.size, flat.nbytes, self._native,
                                              shm is not None, shared, self._calibration)
            fn = ALGORITHMS[name]
        else:
            name, reason = algorithm, "explicit"
            if name not in ALGORITHMS:
                raise ValueError(f'{self._where(f"all_reduce(algorithm={algorithm!r})")}: '
                                 f"unknown algorithm {algorithm!r}; use one of "
                                 f"{', '.join(repr(k) for k in [*ALGORITHMS, 'auto'])}.")
            fn = ALGORITHMS[name]
            if name == "mpi" and not self._native:
                mpi_all_reduce(self.transport, flat, op, 0)  # the clear "no MPI here" error
        plan = (name, reason, fn,
                call_plan("all_reduce", flat.size, flat.dtype, op, -1, name, reason),
                name == "mpi" and self._native and self.size > 1)
        if len(self._plans) >= 256:
            self._plans.clear()
        self._plans[(algorithm, flat.nbytes, flat.dtype, op.code, shared, not tag,
                     type(flat))] = plan
        return plan

    def broadcast(self, array: Any, src: int = 0, tag: int = 0) -> Any:
        """Copy rank ``src``'s ``array`` into ``array`` on every rank (binomial tree); return it."""
        call = f"broadcast(src={src})"
        src = self._root(src, "src", call)
        flat = self._flat(array, call)
        tag = self._stream(tag, call) if tag else 0
        row, wire = self._begin("broadcast", tag, flat, array.shape, None, src, "tree", None)
        try:
            self._agree(call, flat, None, "tree", src, row, tag)
            if self.size > 1 and flat.size > 0:
                tree_broadcast(self.transport, flat, src, wire)
        except CommError as e:
            raise self._failed(row, e, call) from e
        if row is not None:
            Ledger.end(row)
        return array

    def reduce(self, array: Any, dst: int = 0, op: str | ReduceOp = "sum", tag: int = 0) -> Any:
        """Reduce into ``array`` on rank ``dst`` (binomial tree); other ranks keep their data."""
        call = f"reduce(dst={dst})"
        op = self._op(op, call)
        dst = self._root(dst, "dst", call)
        flat = self._flat(array, call)
        tag = self._stream(tag, call) if tag else 0
        row, wire = self._begin("reduce", tag, flat, array.shape, op, dst, "tree", None)
        try:
            self._agree(call, flat, op, "tree", dst, row, tag)
            if self.size > 1 and flat.size > 0:
                work = flat
                if self.rank != dst:  # the tree leaves partial sums behind; keep the caller's
                    work = scratch(self.transport, flat, flat.size, wire, slot=1)
                    work[...] = flat
                tree_reduce(self.transport, work, op, dst, wire)
        except CommError as e:
            raise self._failed(row, e, call) from e
        if self.rank == dst:
            finalize(flat, op, self.size)
        if row is not None:
            Ledger.end(row)
        return array

    def all_gather_into(self, output: Any, array: Any, tag: int = 0) -> Any:
        """Fill ``output`` (world_size * array.size elements) with every rank's ``array``."""
        call = "all_gather_into"
        flat = self._flat(array, call, writable=False)
        out = self._flat(output, call)
        tag = self._stream(tag, call) if tag else 0
        if out.size != self.size * flat.size or out.dtype != flat.dtype:
            raise ValueError(f"{self._where(call)}: output has {out.size} x {out.dtype.name} but "
                             f"needs world_size * input = {self.size} * {flat.size} x "
                             f"{flat.dtype.name}. Allocate it with size {self.size * flat.size}.")
        row, wire = self._begin("all_gather", tag, flat, array.shape, None, -1, "ring", None)
        try:
            self._agree(call, flat, None, "ring", 0, row, tag)
            out[self.rank * flat.size:(self.rank + 1) * flat.size] = flat
            if self.size > 1 and flat.size > 0:
                ring_all_gather(self.transport, out, wire)
        except CommError as e:
            raise self._failed(row, e, call) from e
        if row is not None:
            Ledger.end(row)
        return output

    def all_gather(self, array: Any, tag: int = 0) -> Any:
        """A new array of shape ``(world_size, *array.shape)``: row r is rank r's ``array``."""
        xp = backend.get_array_module(array)
        out = xp.empty((self.size,) + tuple(array.shape), dtype=array.dtype)
        self.all_gather_into(out, array, tag)
        return out

    def reduce_scatter(self, output: Any, input: Any, op: str | ReduceOp = "sum",
                       tag: int = 0) -> Any:
        """Reduce ``input`` (world_size * output.size elements); rank r gets chunk r in ``output``.

        ``input`` is left unchanged (the ring works on a cached scratch copy).
        """
        call = "reduce_scatter"
        op = self._op(op, call)
        src = self._flat(input, call, writable=False)
        out = self._flat(output, call)
        tag = self._stream(tag, call) if tag else 0
        if src.size != self.size * out.size or out.dtype != src.dtype:
            raise ValueError(f"{self._where(call)}: input has {src.size} x {src.dtype.name} but "
                             f"must be world_size * output = {self.size} * {out.size} x "
                             f"{out.dtype.name}.")
        row, wire = self._begin("reduce_scatter", tag, src, input.shape, op, -1, "ring", None)
        try:
            self._agree(call, src, op, "ring", 0, row, tag)
            work = scratch(self.transport, src, src.size, wire, slot=1)
            work[...] = src
            b = ring_reduce_scatter(self.transport, work, op, wire)
        except CommError as e:
            raise self._failed(row, e, call) from e
        out[...] = work[b[self.rank]:b[self.rank + 1]]
        finalize(out, op, self.size)
        if row is not None:
            Ledger.end(row)
        return output

    def barrier(self) -> None:
        """Return once every rank has entered (dissemination: ceil(log2 N) rounds of 1 byte)."""
        row, wire = self._begin("barrier", 0, None, None, None, -1, "dissemination", None)
        try:
            dist = 1
            while dist < self.size:
                self.transport.sendrecv(self._token, (self.rank + dist) % self.size,
                                        self._token_in, (self.rank - dist) % self.size, wire)
                dist <<= 1
        except CommError as e:
            raise self._failed(row, e, "barrier") from e
        if row is not None:
            Ledger.end(row)

    # -- small Python values (JSON, never pickle) --------------------------------------------
    def _encode(self, obj: Any, call: str) -> np.ndarray:
        try:
            return np.frombuffer(json.dumps(obj).encode("utf-8"), dtype=np.uint8)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{self._where(call)}: the object is not JSON-serializable ({e}). "
                             "Send numbers, strings, lists and dicts only (arrays: use "
                             "broadcast/all_gather).") from None

    def broadcast_object(self, obj: Any = None, src: int = 0) -> Any:
        """Rank ``src``'s ``obj`` on every rank (JSON round trip: tuples come back as lists)."""
        call = f"broadcast_object(src={src})"
        src = self._root(src, "src", call)
        data, error = None, None
        if self.rank == src:
            try:
                data = self._encode(obj, call)
            except ValueError as e:
                error = e
        row, wire = self._begin("broadcast_object", 0, None, None, None, src, "tree", None)
        buf = None
        try:
            # A length of -1 tells the other ranks that src failed, so they raise, not hang.
            length = np.array([-1 if error else (0 if data is None else data.size)], np.int64)
            if self.size > 1:
                tree_broadcast(self.transport, length, src, wire)
            if length[0] >= 0:
                buf = data.copy() if data is not None else np.empty(int(length[0]), np.uint8)
                if self.size > 1 and buf.size:
                    tree_broadcast(self.transport, buf, src, wire)
        except CommError as e:
            raise self._failed(row, e, call) from e
        if row is not None:
            Ledger.end(row)  # a failed encode too: every rank raises alike, still in step
        if error is not None:
            raise error
        if buf is None:
            raise CommError(f"{self._where(call)}: rank {src} could not encode its object (its "
                            "own error says why); nothing was broadcast.")
        return json.loads(buf.tobytes().decode("utf-8"))

    def all_gather_object(self, obj: Any) -> list:
        """``[obj of rank 0, obj of rank 1, ...]`` on every rank (JSON: lengths, then bytes)."""
        data = self._encode(obj, "all_gather_object")
        row, wire = self._begin("all_gather_object", 0, None, None, None, -1, "ring", None)
        try:
            lengths = np.zeros(self.size, np.int64)
            lengths[self.rank] = data.size
            ring_all_gather(self.transport, lengths, wire)
            width = int(lengths.max())
            table = np.zeros(self.size * width, np.uint8)
            table[self.rank * width:self.rank * width + data.size] = data
            if width:
                ring_all_gather(self.transport, table, wire)
        except CommError as e:
            raise self._failed(row, e, "all_gather_object") from e
        if row is not None:
            Ledger.end(row)
        return [json.loads(table[r * width:r * width + int(lengths[r])].tobytes().decode("utf-8"))
                for r in range(self.size)]

    # -- auto, explained ---------------------------------------------------------------------
    def auto_table(self) -> dict:
        """What ``algorithm="auto"`` will pick on this group at every power-of-two size.

        JSON-able (see ``select.table``: its ``source`` says whether a calibration or the
        shipped table decides), plus the group's backend and transport; not collective (the
        shared-memory facts and the calibration were settled when the group was made).
        """
        t = select_table(self.size, self._native, self._shm is not None,
                         calibration=self._calibration)
        for row in t["sizes"]:  # several nodes: hier from HIER_MIN_BYTES up, rd below
            by_nodes = choose_for_nodes(self._nodes, row["nbytes"])
            if by_nodes is not None:
                row["plain"] = {"algorithm": by_nodes[0], "reason": by_nodes[1],
                                "predicted_us": None}
        return {"backend": self.backend, "transport": self.transport.name,
                "num_nodes": self.topology.num_nodes, **t}

    def auto_source(self) -> str:
        """Which table ``algorithm="auto"`` uses on this group: ``"calibration <file>"`` (a
        ``python -m minidist.tune`` result every rank holds) or the shipped table."""
        return _select.source(self._calibration)

    def use_calibration(self, calibration: Any) -> None:
        """Make "auto" on this group use ``calibration`` (a ``calibrate.Calibration``; None:
        the shipped table). Every rank must pass the same one, as ``calibrate`` returns it."""
        self._calibration = self._explainer.calibration = calibration
        self._plans.clear()

    def auto_choice(self, array: Any) -> tuple[str, str]:
        """``(algorithm, reason)``: what ``all_reduce(array)`` with "auto" runs, and why; not
        collective, sends nothing."""
        flat = self._flat(array, "auto_choice", writable=False)
        shm = self._shm if type(flat) is np.ndarray else None
        shared = shm is not None and bool(shm.user_windows) and id(flat.base) in _owners(shm)
        return self._plan("auto", flat, ReduceOp.SUM, shared)[:2]

    # -- memory and lifecycle ----------------------------------------------------------------
    def alloc_buffer(self, numel: int, dtype: Any, xp: Any = None) -> Any:
        """A 1-D communication buffer placed where the transport moves data best.

        Collective: every rank calls it alike (DDP allocates its buckets at construction).
        On the MPI transport with every rank on one node, NumPy buffers go into a shared-memory
        window, so ``all_reduce`` on them can take the zero-copy "shm" path (algorithms/shm.py).
        """
        xp = xp or backend.default_array_module()
        if self._worker is not None:
            self._drain()
        if xp is np and self._shm is not None:
            dt = np.dtype(dtype)
            row = (self.ledger.begin("alloc_buffer", 0, int(numel), dt, (int(numel),), None, -1,
                                     "shm", None) if self.ledger.enabled else None)
            try:
                buf = shm_alloc_buffer(self.transport, numel, dtype)
            except CommError as e:
                raise self._failed(row, e, "alloc_buffer") from e
            if row is not None:
                Ledger.end(row)
            return buf
        return self.transport.alloc_buffer(numel, dtype, xp)

    def free_buffer(self, buf: Any) -> bool:
        """Release a buffer from ``alloc_buffer`` now instead of at exit (shared windows).

        Collective when ``buf`` lives in a shared-memory window: every rank calls it alike.
        Every array that views ``buf`` must be dropped first (its memory is unmapped).
        Returns True if a window was freed, False for an ordinary array (nothing to do).
        """
        return shm_free_buffer(self.transport, buf)

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

    def new_group(self, ranks: list[int] | None = None, timeout_s: float | None = None
                  ) -> ProcessGroup | None:
        """A group of some of this group's ranks (``minidist.new_group`` on the world).

        COLLECTIVE over this group: every rank calls it with the same ``ranks`` in the same
        order as its other ``new_group`` calls. Rank ``ranks[i]`` is rank ``i`` of the new
        group; ranks outside ``ranks`` get None. MPI splits its communicator; other transports
        give the group a ``SubgroupTransport`` view that shares this group's connections in a
        tag space of its own, so every collective (and DDP) works on it unchanged.

        Args:
            ranks: distinct ranks of this group (default: all of them).
            timeout_s: deadline of the new group's waits (default: this group's).

        Raises:
            ValueError: ``ranks`` are not distinct ranks of this group.
        """
        members = list(range(self.size)) if ranks is None else list(ranks)
        if len(set(members)) != len(members) or not members or any(
                isinstance(r, bool) or not isinstance(r, (int, np.integer))
                or not 0 <= r < self.size for r in members):
            raise ValueError(f"{self._where(f'new_group(ranks={ranks!r})')}: ranks must be "
                             f"distinct integers in [0, {self.size}), at least one.")
        members = [int(r) for r in members]
        if self.size == 1:
            return self
        self._drain()
        sub = self.transport.split(members, self.transport.timeout_s if timeout_s is None
                                   else float(timeout_s))
        if sub is None:
            return None
        return ProcessGroup(sub, algorithm=self.algorithm, backend=self.backend)

    def __repr__(self) -> str:
        return (f"ProcessGroup(backend={self.backend!r}, rank={self.rank}, size={self.size}, "
                f"algorithm={self.algorithm!r})")


def new_group_from_transport(transport: Transport, **kwargs: Any) -> ProcessGroup:
    """A ProcessGroup over ``transport`` (tests: one per thread of the threads transport)."""
    return ProcessGroup(transport, **kwargs)


__all__ = ["ProcessGroup", "new_group_from_transport"]
