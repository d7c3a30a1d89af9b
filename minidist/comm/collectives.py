"""The collectives beside all_reduce, each a function of a process group: broadcast, reduce,
all_gather, reduce_scatter and barrier. ``ProcessGroup`` (group.py) binds them as its methods
(``*_object``: objects.py; ``new_group``: subgroups.py; buffers: group_shared_memory.py).

    group.broadcast(weights, src=0)                 # binomial tree (algorithms/tree.py)
    out = group.all_gather(x)                       # shape (world_size, *x.shape), ring
    group.reduce_scatter(out_chunk, full, op="avg") # rank r gets chunk r of the reduction

Each reads as ``all_reduce`` does, through the group's public surface::

    validate on this rank (validate.py: ValueError before any message: bad array, op, root, tag)
    -> with group.observed(spec, stream) as call:   queued async collectives first, then the
           call numbered and tagged (calls.py), its observers started
           run the algorithm with call.tag           a CommError: the diagnosed error
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from minidist import xp as backend
from minidist.comm.algorithms.ring import ring_all_gather, ring_reduce_scatter
from minidist.comm.algorithms.scratch import scratch
from minidist.comm.algorithms.tree import tree_broadcast, tree_reduce
from minidist.comm.calls import call_spec
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


__all__ = ["broadcast", "reduce", "all_gather_into", "all_gather", "reduce_scatter", "barrier"]
