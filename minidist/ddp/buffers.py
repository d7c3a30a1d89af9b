"""DDP's module buffers (BatchNorm running statistics): rank 0's go to every rank, one flat
message per dtype.

    packs = pack_buffers(module)        # once, at construction: [(flat, [buffer arrays])]
    broadcast_buffer_packs(packs, group)   # COLLECTIVE: before a forward (broadcast_buffers)
    broadcast_others(module, params, src, group)   # COLLECTIVE: construction and join's end
"""

from __future__ import annotations

from typing import Any

from minidist import comm
from minidist import xp as backend
from minidist.optim.grad_scaling import master_owner


def pack_buffers(module: Any) -> list[tuple[Any, list[Any]]]:
    """Group the module's buffers by dtype, each group with a cached flat array.

    Returns ``[(flat, [buffer arrays])]``: ``broadcast_buffer_packs`` copies the buffers into
    ``flat``, broadcasts it once, and copies back, so a BatchNorm model pays one message
    per dtype per step (float32 statistics + int64 counters: two), not one per buffer.
    """
    arrays = [t.array for _, t in module.named_buffers()] \
        if hasattr(module, "named_buffers") else []
    by_dtype: dict[Any, list[Any]] = {}
    for arr in arrays:
        by_dtype.setdefault((arr.dtype, backend.get_array_module(arr)), []).append(arr)
    return [(xp.empty(sum(a.size for a in group), dtype=dtype), group)
            for (dtype, xp), group in by_dtype.items()]


def broadcast_buffer_packs(packs: list[tuple[Any, list[Any]]], group: Any = None) -> None:
    """Rank 0's buffers to every rank: one broadcast per dtype (COLLECTIVE)."""
    for flat, arrays in packs:
        at = 0
        for a in arrays:
            flat[at:at + a.size] = a.reshape(-1)
            at += a.size
        comm.broadcast(flat, src=0, group=group)
        at = 0
        for a in arrays:
            a[...] = flat[at:at + a.size].reshape(a.shape)
            at += a.size


def broadcast_others(module: Any, params: list[Any], src: int, group: Any = None) -> None:
    """Rank ``src``'s state beside the bucketed parameters ``params`` (COLLECTIVE): the float32
    master weights of a model converted by amp.MasterWeights, the frozen parameters and the
    buffers, one broadcast each."""
    # float16 weights (amp.MasterWeights): the float32 masters the optimizer steps, too
    owners = {id(o): o for o in map(master_owner, params) if o is not None}
    for owner in owners.values():
        comm.broadcast(owner.master_buffer, src=src, group=group)
    others = [p for _, p in module.named_parameters() if not p.requires_grad]
    if hasattr(module, "named_buffers"):
        others += [t for _, t in module.named_buffers()]
    for t in others:
        arr = t.array if hasattr(t, "array") else t
        if arr.flags.c_contiguous:
            comm.broadcast(arr, src=src, group=group)
        else:
            tmp = backend.get_array_module(arr).ascontiguousarray(arr)
            comm.broadcast(tmp, src=src, group=group)
            arr[...] = tmp


__all__ = ["broadcast_buffer_packs", "broadcast_others", "pack_buffers"]
