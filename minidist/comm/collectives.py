"""The collectives beside all_reduce: broadcast, reduce, all_gather, reduce_scatter, barrier,
the ``*_object`` collectives, ``alloc_buffer`` and ``new_group``; ``ProcessGroup`` (group.py)
inherits them.

    group.broadcast(weights, src=0)                 # binomial tree (algorithms/tree.py)
    out = group.all_gather(x)                       # shape (world_size, *x.shape), ring
    group.reduce_scatter(out_chunk, full, op="avg") # rank r gets chunk r of the reduction
    names = group.all_gather_object({"host": h})    # small JSON-able values, no pickle
    sub = group.new_group([0, 1])                   # a ProcessGroup of some ranks, or None

Each takes the ledger's general path (``all_reduce`` has a faster form of it, group.py)::

    validate on this rank (ValueError before any message: bad array, op, root, tag)
    -> _begin: queued async collectives first; ledger row, fingerprint -> message tag
    -> (debug) check_agreement; run it; a CommError goes to the diagnosis (on_failure)
    -> Ledger.end(row)

``barrier`` and the ``*_object`` collectives use stream 0. Sub-groups (``new_group``): the
transport's ``split`` (MPI: ``MPI_Comm_split``; elsewhere a ``SubgroupTransport`` view with its
own tag space) under a new ProcessGroup.
"""

from __future__ import annotations

import json
from typing import Any, Callable

import numpy as np

from minidist import xp as backend
from minidist.comm.algorithms.ring import ring_all_gather, ring_reduce_scatter
from minidist.comm.algorithms.scratch import scratch
from minidist.comm.algorithms.shm import shm_alloc_buffer
from minidist.comm.algorithms.tree import tree_broadcast, tree_reduce
from minidist.comm.diagnosis.consistency import check_agreement
from minidist.comm.diagnosis.ledger import Ledger
from minidist.comm.errors import CommError
from minidist.comm.ops import ReduceOp, finalize
from minidist.comm.transports.base import Transport
from minidist.comm.transports.shm_window import shm_free_buffer


class Collectives:
    """Mixin of ProcessGroup: the collectives other than all_reduce (module docstring).

    It uses what ProcessGroup defines: the validators (``_flat``, ``_op``, ``_root``,
    ``_stream``), ``_begin`` and ``_failed`` around each call, ``_drain``.
    """

    transport: Transport
    rank: int
    size: int
    algorithm: str
    backend: str
    check_consistency: bool
    _token: Any
    _token_in: Any
    _shm: Any
    _worker: Any
    ledger: Ledger
    where: Callable[[str], str]
    _flat: Callable[..., Any]
    _op: Callable[[Any, str], ReduceOp]
    _root: Callable[[int, str, str], int]
    _stream: Callable[[Any, str], int]
    _begin: Callable[..., tuple]
    _failed: Callable[[Any, CommError, str], CommError]
    _drain: Callable[[], None]

    def broadcast(self, array: Any, src: int = 0, tag: int = 0) -> Any:
        """Copy rank ``src``'s ``array`` into ``array`` on every rank (binomial tree); return it."""
        call = f"broadcast(src={src})"
        src = self._root(src, "src", call)
        flat = self._flat(array, call)
        tag = self._stream(tag, call) if tag else 0
        row, wire = self._begin("broadcast", tag, flat, array.shape, None, src, "tree", None)
        try:
            check_agreement(self, call, flat, None, "tree", src, row, tag)
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
            check_agreement(self, call, flat, op, "tree", dst, row, tag)
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
            raise ValueError(f"{self.where(call)}: output has {out.size} x {out.dtype.name} but "
                             f"needs world_size * input = {self.size} * {flat.size} x "
                             f"{flat.dtype.name}. Allocate it with size {self.size * flat.size}.")
        row, wire = self._begin("all_gather", tag, flat, array.shape, None, -1, "ring", None)
        try:
            check_agreement(self, call, flat, None, "ring", 0, row, tag)
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
            raise ValueError(f"{self.where(call)}: input has {src.size} x {src.dtype.name} but "
                             f"must be world_size * output = {self.size} * {out.size} x "
                             f"{out.dtype.name}.")
        row, wire = self._begin("reduce_scatter", tag, src, input.shape, op, -1, "ring", None)
        try:
            check_agreement(self, call, src, op, "ring", 0, row, tag)
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
            raise ValueError(f"{self.where(call)}: the object is not JSON-serializable ({e}). "
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
            raise CommError(f"{self.where(call)}: rank {src} could not encode its object (its "
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

    # -- memory ----------------------------------------------------------------------------
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

    # -- sub-groups ------------------------------------------------------------------------
    def new_group(self, ranks: list[int] | None = None, timeout_s: float | None = None
                  ) -> Any:
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
            raise ValueError(f"{self.where(f'new_group(ranks={ranks!r})')}: ranks must be "
                             f"distinct integers in [0, {self.size}), at least one.")
        members = [int(r) for r in members]
        if self.size == 1:
            return self
        self._drain()
        sub = self.transport.split(members, self.transport.timeout_s if timeout_s is None
                                   else float(timeout_s))
        if sub is None:
            return None
        make: Any = type(self)  # ProcessGroup
        return make(sub, algorithm=self.algorithm, backend=self.backend)


__all__ = ["Collectives"]
