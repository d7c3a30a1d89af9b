"""The collectives beside all_reduce, each a function of a process group: broadcast, reduce,
all_gather, reduce_scatter, barrier, the ``*_object`` collectives, ``alloc_buffer`` and
``new_group``. ``ProcessGroup`` (group.py) binds them as its methods.

    group.broadcast(weights, src=0)                 # binomial tree (algorithms/tree.py)
    out = group.all_gather(x)                       # shape (world_size, *x.shape), ring
    group.reduce_scatter(out_chunk, full, op="avg") # rank r gets chunk r of the reduction
    names = group.all_gather_object({"host": h})    # small JSON-able values, no pickle
    sub = group.new_group([0, 1])                   # a ProcessGroup of some ranks, or None

Each reads as ``all_reduce`` does, through the group's public surface::

    validate on this rank (validate.py: ValueError before any message: bad array, op, root, tag)
    -> with group.observed(spec, stream) as call:   queued async collectives first, then the
           call numbered and tagged (calls.py), its observers started
           run the algorithm with call.tag           a CommError: the diagnosed error

``barrier`` and the ``*_object`` collectives use stream 0. Sub-groups (``new_group``): the
transport's ``split`` (MPI: ``MPI_Comm_split``; elsewhere a ``SubgroupTransport`` view with its
own tag space) under a new ProcessGroup.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import numpy as np

from minidist import xp as backend
from minidist.comm.algorithms.ring import ring_all_gather, ring_reduce_scatter
from minidist.comm.algorithms.scratch import scratch
from minidist.comm.algorithms.tree import tree_broadcast, tree_reduce
from minidist.comm.calls import call_spec
from minidist.comm.errors import CommError
from minidist.comm.ops import ReduceOp, finalize
from minidist.comm.validate import flat_view, reduce_op, root_rank, stream_tag

if TYPE_CHECKING:
    from minidist.comm.group import ProcessGroup


def broadcast(group: ProcessGroup, array: Any, src: int = 0, tag: int = 0) -> Any:
    """Copy rank ``src``'s ``array`` into ``array`` on every rank (binomial tree); return it."""
    call = f"broadcast(src={src})"
    src = root_rank(group, src, "src", call)
    flat = flat_view(group, array, call)
    stream = stream_tag(group, tag, call) if tag else 0
    spec = call_spec("broadcast", call, flat.size, flat.dtype, None, src, "tree")
    with group.observed(spec, stream, array.shape) as c:
        if group.size > 1 and flat.size > 0:
            tree_broadcast(group.transport, flat, src, c.tag)
    return array


def reduce(group: ProcessGroup, array: Any, dst: int = 0, op: str | ReduceOp = "sum",
           tag: int = 0) -> Any:
    """Reduce into ``array`` on rank ``dst`` (binomial tree); other ranks keep their data."""
    call = f"reduce(dst={dst})"
    rop = reduce_op(group, op, call)
    dst = root_rank(group, dst, "dst", call)
    flat = flat_view(group, array, call)
    stream = stream_tag(group, tag, call) if tag else 0
    spec = call_spec("reduce", call, flat.size, flat.dtype, rop, dst, "tree")
    with group.observed(spec, stream, array.shape) as c:
        if group.size > 1 and flat.size > 0:
            work = flat
            if group.rank != dst:  # the tree leaves partial sums behind; keep the caller's
                work = scratch(group.transport, flat, flat.size, c.tag, slot=1)
                work[...] = flat
            tree_reduce(group.transport, work, rop, dst, c.tag)
        if group.rank == dst:
            finalize(flat, rop, group.size)
    return array


def all_gather_into(group: ProcessGroup, output: Any, array: Any, tag: int = 0) -> Any:
    """Fill ``output`` (world_size * array.size elements) with every rank's ``array``."""
    call = "all_gather_into"
    flat = flat_view(group, array, call, writable=False)
    out = flat_view(group, output, call)
    stream = stream_tag(group, tag, call) if tag else 0
    if out.size != group.size * flat.size or out.dtype != flat.dtype:
        raise ValueError(f"{group.where(call)}: output has {out.size} x {out.dtype.name} but "
                         f"needs world_size * input = {group.size} * {flat.size} x "
                         f"{flat.dtype.name}. Allocate it with size {group.size * flat.size}.")
    spec = call_spec("all_gather", call, flat.size, flat.dtype, None, -1, "ring")
    with group.observed(spec, stream, array.shape) as c:
        out[group.rank * flat.size:(group.rank + 1) * flat.size] = flat
        if group.size > 1 and flat.size > 0:
            ring_all_gather(group.transport, out, c.tag)
    return output


def all_gather(group: ProcessGroup, array: Any, tag: int = 0) -> Any:
    """A new array of shape ``(world_size, *array.shape)``: row r is rank r's ``array``."""
    xp = backend.get_array_module(array)
    out = xp.empty((group.size,) + tuple(array.shape), dtype=array.dtype)
    all_gather_into(group, out, array, tag)
    return out


def reduce_scatter(group: ProcessGroup, output: Any, input: Any, op: str | ReduceOp = "sum",
                   tag: int = 0) -> Any:
    """Reduce ``input`` (world_size * output.size elements); rank r gets chunk r in ``output``.

    ``input`` is left unchanged (the ring works on a cached scratch copy).
    """
    call = "reduce_scatter"
    rop = reduce_op(group, op, call)
    src = flat_view(group, input, call, writable=False)
    out = flat_view(group, output, call)
    stream = stream_tag(group, tag, call) if tag else 0
    if src.size != group.size * out.size or out.dtype != src.dtype:
        raise ValueError(f"{group.where(call)}: input has {src.size} x {src.dtype.name} but "
                         f"must be world_size * output = {group.size} * {out.size} x "
                         f"{out.dtype.name}.")
    spec = call_spec("reduce_scatter", call, src.size, src.dtype, rop, -1, "ring")
    with group.observed(spec, stream, input.shape) as c:
        work = scratch(group.transport, src, src.size, c.tag, slot=1)
        work[...] = src
        b = ring_reduce_scatter(group.transport, work, rop, c.tag)
        out[...] = work[b[group.rank]:b[group.rank + 1]]
        finalize(out, rop, group.size)
    return output


def barrier(group: ProcessGroup) -> None:
    """Return once every rank has entered (dissemination: ceil(log2 N) rounds of 1 byte)."""
    token, token_in = np.zeros(1, np.uint8), np.zeros(1, np.uint8)
    with group.observed(call_spec("barrier", "barrier", algorithm="dissemination")) as c:
        dist = 1
        while dist < group.size:
            group.transport.sendrecv(token, (group.rank + dist) % group.size, token_in,
                                     (group.rank - dist) % group.size, c.tag)
            dist <<= 1


# -- small Python values (JSON, never pickle) --------------------------------------------
def _encode(group: ProcessGroup, obj: Any, call: str) -> np.ndarray:
    try:
        return np.frombuffer(json.dumps(obj).encode("utf-8"), dtype=np.uint8)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{group.where(call)}: the object is not JSON-serializable ({e}). "
                         "Send numbers, strings, lists and dicts only (arrays: use "
                         "broadcast/all_gather).") from None


def broadcast_object(group: ProcessGroup, obj: Any = None, src: int = 0) -> Any:
    """Rank ``src``'s ``obj`` on every rank (JSON round trip: tuples come back as lists)."""
    call = f"broadcast_object(src={src})"
    src = root_rank(group, src, "src", call)
    data, error = None, None
    if group.rank == src:
        try:
            data = _encode(group, obj, call)
        except ValueError as e:
            error = e
    buf = None
    with group.observed(call_spec("broadcast_object", call, root=src, algorithm="tree")) as c:
        # A length of -1 tells the other ranks that src failed, so they raise, not hang.
        length = np.array([-1 if error else (0 if data is None else data.size)], np.int64)
        if group.size > 1:
            tree_broadcast(group.transport, length, src, c.tag)
        if length[0] >= 0:
            buf = data.copy() if data is not None else np.empty(int(length[0]), np.uint8)
            if group.size > 1 and buf.size:
                tree_broadcast(group.transport, buf, src, c.tag)
    if error is not None:  # raised after the call ended: every rank raises alike, in step
        raise error
    if buf is None:
        raise CommError(f"{group.where(call)}: rank {src} could not encode its object (its "
                        "own error says why); nothing was broadcast.")
    return json.loads(buf.tobytes().decode("utf-8"))


def all_gather_object(group: ProcessGroup, obj: Any) -> list:
    """``[obj of rank 0, obj of rank 1, ...]`` on every rank (JSON: lengths, then bytes)."""
    call = "all_gather_object"
    data = _encode(group, obj, call)
    with group.observed(call_spec("all_gather_object", call, algorithm="ring")) as c:
        lengths = np.zeros(group.size, np.int64)
        lengths[group.rank] = data.size
        ring_all_gather(group.transport, lengths, c.tag)
        width = int(lengths.max())
        table = np.zeros(group.size * width, np.uint8)
        table[group.rank * width:group.rank * width + data.size] = data
        if width:
            ring_all_gather(group.transport, table, c.tag)
    return [json.loads(table[r * width:r * width + int(lengths[r])].tobytes().decode("utf-8"))
            for r in range(group.size)]


# -- memory ----------------------------------------------------------------------------------
def alloc_buffer(group: ProcessGroup, numel: int, dtype: Any, xp: Any = None) -> Any:
    """A 1-D communication buffer placed where the transport moves data best.

    Collective: every rank calls it alike (DDP allocates its buckets at construction).
    Where the group has shared memory (the fast-path wing's: MPI, every rank on one node),
    NumPy buffers go into a shared window, so ``all_reduce`` on them can take the zero-copy
    "shm" path (minidist/fastpath/shm.py); otherwise the transport allocates.
    """
    xp = xp or backend.default_array_module()
    group.drain()
    if xp is np and group.shared_memory is not None:
        dt = np.dtype(dtype)
        spec = call_spec("alloc_buffer", "alloc_buffer", int(numel), dt, algorithm="shm")
        with group.observed(spec, 0, (int(numel),)):
            return group.shared_memory.alloc_buffer(numel, dtype)
    return group.transport.alloc_buffer(numel, dtype, xp)


def free_buffer(group: ProcessGroup, buf: Any) -> bool:
    """Release a buffer from ``alloc_buffer`` now instead of at exit (shared windows).

    Collective when ``buf`` lives in a shared-memory window: every rank calls it alike.
    Every array that views ``buf`` must be dropped first (its memory is unmapped).
    Returns True if a window was freed, False for an ordinary array (nothing to do).
    """
    shared = group.shared_memory
    return shared.free_buffer(buf) if shared is not None else False


# -- sub-groups ------------------------------------------------------------------------------
def new_group(group: ProcessGroup, ranks: list[int] | None = None,
              timeout_s: float | None = None) -> Any:
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
    members = list(range(group.size)) if ranks is None else list(ranks)
    if len(set(members)) != len(members) or not members or any(
            isinstance(r, bool) or not isinstance(r, (int, np.integer))
            or not 0 <= r < group.size for r in members):
        raise ValueError(f"{group.where(f'new_group(ranks={ranks!r})')}: ranks must be "
                         f"distinct integers in [0, {group.size}), at least one.")
    members = [int(r) for r in members]
    if group.size == 1:
        return group
    group.drain()
    sub = group.transport.split(members, group.transport.timeout_s if timeout_s is None
                                else float(timeout_s))
    if sub is None:
        return None
    return type(group)(sub, algorithm=group.algorithm, backend=group.backend)


__all__ = ["broadcast", "reduce", "all_gather_into", "all_gather", "reduce_scatter", "barrier",
           "broadcast_object", "all_gather_object", "alloc_buffer", "free_buffer", "new_group"]
