"""DDP's module buffers (BatchNorm running statistics): rank 0's go to every rank, one flat
message per dtype.

    packs = pack_buffers(module)        # once, at construction: [(flat, [buffer arrays])]
    broadcast_buffer_packs(packs, group)   # COLLECTIVE: before a forward (broadcast_buffers)
"""

from __future__ import annotations

from typing import Any

from minidist import comm
from minidist import xp as backend


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


__all__ = ["broadcast_buffer_packs", "pack_buffers"]
