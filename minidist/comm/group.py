"""ProcessGroup: a Transport plus the collectives, validated and dispatched to an algorithm.

    group = ProcessGroup(transport)                 # any Transport: mpi, tcp, threads, local
    group.all_reduce(grad, op="sum")                # in place; algorithm="auto" by default
    group.broadcast(weights, src=0)
    out = group.all_gather(x)                       # shape (world_size, *x.shape)
    group.reduce_scatter(out_chunk, full, op="avg") # rank r gets chunk r of the reduction
    names = group.all_gather_object({"host": h})    # small JSON-able values, no pickle

The module-level functions in ``minidist.comm.api`` (``all_reduce``, ``get_rank``, ...) call the
default group that ``init_process_group`` creates; tests build groups over the threads transport.

Every call validates its arguments on this rank BEFORE any message is sent: a non-contiguous
or read-only array, an unknown op/algorithm/dtype, or a src/dst out of range is a ValueError
``[rank r/N] all_reduce(algorithm="ring"): <what>. <fix>.``. Arrays that differ across ranks
can only be seen by talking: with ``check_consistency=True`` (default: ``MINIDIST_DEBUG>=1``)
each collective first all-gathers (numel, dtype, op, algorithm) and raises CommError naming
the rank that differs. Without it a size mismatch is still caught by the receive byte count
(CommError) or, in the worst case, ends in CommTimeout.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

import numpy as np

from minidist import xp as backend
from minidist.comm.algorithms import ALGORITHMS, resolve
from minidist.comm.algorithms.mpi_native import supports_native
from minidist.comm.algorithms.ring import ring_all_gather, ring_reduce_scatter
from minidist.comm.algorithms.scratch import clear as clear_scratch
from minidist.comm.algorithms.scratch import scratch
from minidist.comm.algorithms.shm import shm_alloc_buffer, shm_available
from minidist.comm.algorithms.tree import tree_broadcast, tree_reduce
from minidist.comm.errors import CommError
from minidist.comm.ops import SUPPORTED, SUPPORTED_DTYPES, ReduceOp, finalize, parse_op
from minidist.comm.transports.base import Transport
from minidist.log import debug_level, get_logger

log = get_logger(__name__)

META_TAG_OFFSET = 16384  # metadata checks run on tag + offset, apart from the data messages
BARRIER_TAG = 32000
OBJECT_TAG = 32001
_OPS = list(ReduceOp)


def _algo_code(name: str) -> int:
    return zlib.crc32(name.encode())  # any registered name, stable across ranks


class ProcessGroup:
    """The ranks of one transport and the collectives over them.

    Args:
        transport: moves the bytes (``rank`` and ``size`` come from it).
        algorithm: default all-reduce algorithm ("auto", "ring", "tree", "rd", "direct", "mpi").
        check_consistency: all-gather shapes/dtypes before each collective (debug mode);
            default ``MINIDIST_DEBUG >= 1``.
        backend: name for logs ("mpi", "tcp", "threads", "local").
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
        self._token = np.zeros(1, np.uint8)
        self._token_in = np.zeros(1, np.uint8)

    # -- helpers -----------------------------------------------------------------------------
    def _where(self, call: str) -> str:
        return f"[rank {self.rank}/{self.size}] {call}"

    def _flat(self, array: Any, call: str, writable: bool = True) -> Any:
        """Validate ``array`` and return a flat view of it (never a copy)."""
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
            return parse_op(op)
        except ValueError as e:
            raise ValueError(f"{self._where(call)}: {e}.") from None

    def _agree(self, call: str, flat: Any, op: ReduceOp | None, algo: str, root: int, tag: int
               ) -> None:
        """Debug mode: all-gather (numel, dtype, op, algorithm, root) and compare with rank 0."""
        if not self.check_consistency or self.size == 1:
            return
        fields = ("numel", "dtype", "op", "algorithm", "root")
        mine = [flat.size, SUPPORTED_DTYPES.index(flat.dtype.name),
                -1 if op is None else _OPS.index(op), _algo_code(algo), root]
        table = np.zeros(self.size * len(mine), np.int64)
        table[self.rank * len(mine):(self.rank + 1) * len(mine)] = mine
        ring_all_gather(self.transport, table, tag + META_TAG_OFFSET)
        rows = table.reshape(self.size, len(mine))
        algos = {_algo_code(a): a for a in ("auto", *ALGORITHMS)}
        for r in range(1, self.size):
            diff = [i for i in range(len(mine)) if rows[r, i] != rows[0, i]]
            if diff:
                i = diff[0]
                show = {0: lambda v: f"{v} elements", 1: lambda v: SUPPORTED_DTYPES[v],
                        2: lambda v: _OPS[v].value if v >= 0 else "-",
                        3: lambda v: algos.get(v, str(v)), 4: str}[i]
                raise CommError(
                    f"{self._where(call)}: rank {r} passed {fields[i]}={show(int(rows[r, i]))} "
                    f"but rank 0 passed {fields[i]}={show(int(rows[0, i]))}. Every rank must pass "
                    "the same shape, dtype, op and algorithm; check that all ranks build the same "
                    "model and call the same collectives in the same order.")

    # -- collectives on arrays ---------------------------------------------------------------
    def all_reduce(self, array: Any, op: str | ReduceOp = "sum", algorithm: str | None = None,
                   tag: int = 0) -> Any:
        """Reduce ``array`` across ranks, in place; every rank gets identical bits.

        Args:
            array: C-contiguous, writable numpy/cupy array (float16/32/64, int32/64).
            op: "sum", "avg", "max", "min", "prod" or a ReduceOp. Integer AVG floors.
            algorithm: "auto" (cost model), "ring", "tree", "rd", "direct" or "mpi";
                default the group's.
            tag: message stream; concurrent collectives (threads) need distinct tags.

        Returns:
            ``array`` itself (torch returns None; returning the buffer allows chaining).

        Raises:
            ValueError: bad argument on this rank (nothing was sent).
            CommError: ranks disagree (debug mode) or a peer failed; CommTimeout on a deadline.
        """
        algorithm = self.algorithm if algorithm is None else algorithm
        call = f'all_reduce(algorithm="{algorithm}")'
        op = self._op(op, call)
        flat = self._flat(array, call)
        try:
            name, fn = resolve(algorithm, self.transport, flat)
        except ValueError as e:
            raise ValueError(f"{self._where(call)}: {e}.") from None
        if name == "mpi" and not supports_native(self.transport):
            fn(self.transport, flat, op, tag)  # raises the clear "no MPI here" before any message
        self._agree(call, flat, op, algorithm, 0, tag)
        if self._debug >= 1:
            log.debug("all_reduce: %s ran %s on %d x %s (%d bytes, op=%s, n=%d)", algorithm, name,
                      flat.size, flat.dtype.name, flat.nbytes, op.value, self.size)
        fn(self.transport, flat, op, tag)
        return array

    def broadcast(self, array: Any, src: int = 0, tag: int = 0) -> Any:
        """Copy rank ``src``'s ``array`` into ``array`` on every rank (binomial tree); return it."""
        call = f"broadcast(src={src})"
        src = self._root(src, "src", call)
        flat = self._flat(array, call)
        self._agree(call, flat, None, "auto", src, tag)
        if self.size > 1 and flat.size > 0:
            tree_broadcast(self.transport, flat, src, tag)
        return array

    def reduce(self, array: Any, dst: int = 0, op: str | ReduceOp = "sum", tag: int = 0) -> Any:
        """Reduce into ``array`` on rank ``dst`` (binomial tree); other ranks keep their data."""
        call = f"reduce(dst={dst})"
        op = self._op(op, call)
        dst = self._root(dst, "dst", call)
        flat = self._flat(array, call)
        self._agree(call, flat, op, "auto", dst, tag)
        if self.size > 1 and flat.size > 0:
            work = flat
            if self.rank != dst:  # the tree leaves partial sums behind; keep the caller's data
                work = scratch(self.transport, flat, flat.size, tag, slot=1)
                work[...] = flat
            tree_reduce(self.transport, work, op, dst, tag)
        if self.rank == dst:
            finalize(flat, op, self.size)
        return array

    def all_gather_into(self, output: Any, array: Any, tag: int = 0) -> Any:
        """Fill ``output`` (world_size * array.size elements) with every rank's ``array``."""
        call = "all_gather_into"
        flat = self._flat(array, call, writable=False)
        out = self._flat(output, call)
        if out.size != self.size * flat.size or out.dtype != flat.dtype:
            raise ValueError(f"{self._where(call)}: output has {out.size} x {out.dtype.name} but "
                             f"needs world_size * input = {self.size} * {flat.size} x "
                             f"{flat.dtype.name}. Allocate it with size {self.size * flat.size}.")
        self._agree(call, flat, None, "auto", 0, tag)
        out[self.rank * flat.size:(self.rank + 1) * flat.size] = flat
        if self.size > 1 and flat.size > 0:
            ring_all_gather(self.transport, out, tag)
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
        if src.size != self.size * out.size or out.dtype != src.dtype:
            raise ValueError(f"{self._where(call)}: input has {src.size} x {src.dtype.name} but "
                             f"must be world_size * output = {self.size} * {out.size} x "
                             f"{out.dtype.name}.")
        self._agree(call, src, op, "ring", 0, tag)
        work = scratch(self.transport, src, src.size, tag, slot=1)
        work[...] = src
        b = ring_reduce_scatter(self.transport, work, op, tag)
        out[...] = work[b[self.rank]:b[self.rank + 1]]
        finalize(out, op, self.size)
        return output

    def barrier(self) -> None:
        """Return once every rank has entered (dissemination: ceil(log2 N) rounds of 1 byte)."""
        dist = 1
        while dist < self.size:
            self.transport.sendrecv(self._token, (self.rank + dist) % self.size, self._token_in,
                                    (self.rank - dist) % self.size, BARRIER_TAG)
            dist <<= 1

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
        # A length of -1 tells the other ranks that src failed, so they raise instead of hanging.
        length = np.array([-1 if error else (0 if data is None else data.size)], np.int64)
        if self.size > 1:
            tree_broadcast(self.transport, length, src, OBJECT_TAG)
        if error is not None:
            raise error
        if length[0] < 0:
            raise CommError(f"{self._where(call)}: rank {src} could not encode its object (its "
                            "own error says why); nothing was broadcast.")
        buf = data.copy() if data is not None else np.empty(int(length[0]), np.uint8)
        if self.size > 1 and buf.size:
            tree_broadcast(self.transport, buf, src, OBJECT_TAG)
        return json.loads(buf.tobytes().decode("utf-8"))

    def all_gather_object(self, obj: Any) -> list:
        """``[obj of rank 0, obj of rank 1, ...]`` on every rank (JSON: lengths, then bytes)."""
        data = self._encode(obj, "all_gather_object")
        lengths = np.zeros(self.size, np.int64)
        lengths[self.rank] = data.size
        ring_all_gather(self.transport, lengths, OBJECT_TAG)
        width = int(lengths.max())
        table = np.zeros(self.size * width, np.uint8)
        table[self.rank * width:self.rank * width + data.size] = data
        if width:
            ring_all_gather(self.transport, table, OBJECT_TAG)
        return [json.loads(table[r * width:r * width + int(lengths[r])].tobytes().decode("utf-8"))
                for r in range(self.size)]

    # -- memory and lifecycle ----------------------------------------------------------------
    def alloc_buffer(self, numel: int, dtype: Any, xp: Any = None) -> Any:
        """A 1-D communication buffer placed where the transport moves data best.

        Collective: every rank calls it alike (DDP allocates its buckets at construction).
        On the MPI transport with every rank on one node, NumPy buffers go into a shared-memory
        window, so ``all_reduce`` on them can take the zero-copy "shm" path (algorithms/shm.py).
        """
        xp = xp or backend.default_array_module()
        if xp is np and shm_available(self.transport):  # collective the first time
            return shm_alloc_buffer(self.transport, numel, dtype)
        return self.transport.alloc_buffer(numel, dtype, xp)

    def close(self) -> None:
        """Release the transport and the cached scratch buffers. Idempotent."""
        clear_scratch(self.transport)
        self.transport.close()

    def __repr__(self) -> str:
        return (f"ProcessGroup(backend={self.backend!r}, rank={self.rank}, size={self.size}, "
                f"algorithm={self.algorithm!r})")


def new_group_from_transport(transport: Transport, **kwargs: Any) -> ProcessGroup:
    """A ProcessGroup over ``transport`` (tests: one per thread of the threads transport)."""
    return ProcessGroup(transport, **kwargs)

