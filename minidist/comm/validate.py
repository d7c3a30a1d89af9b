"""Argument checks of the collectives: a ValueError on this rank before any message is sent.

    flat = flat_view(group, array, "broadcast(src=0)")      # a flat view, never a copy
    op = reduce_op(group, "max", "reduce(dst=0)")            # a ReduceOp
    src = root_rank(group, 0, "src", "broadcast(src=0)")     # a rank of the group
    stream = stream_tag(group, 3, "all_gather_into")         # 0 <= tag < MAX_STREAMS

Every message starts with ``group.where(call)`` (``[rank r/N] call``) and says how to fix it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minidist.comm.ops import SUPPORTED, SUPPORTED_DTYPES, ReduceOp, parse_op
from minidist.comm.transports.base import MAX_STREAMS

FAST_OPS: dict = {**{o.value: o for o in ReduceOp}, **{o: o for o in ReduceOp}}


def flat_view(group: Any, array: Any, call: str, writable: bool = True) -> Any:
    """Validate ``array`` and return a flat view of it (never a copy): a 1-D array itself (its
    ``base`` tells whether it lies in a shared window)."""
    if not hasattr(array, "dtype") or not hasattr(array, "flags"):
        raise ValueError(f"{group.where(call)}: expected a numpy or cupy array, got "
                         f"{type(array).__name__}. Wrap the data with np.asarray(...) first.")
    if array.dtype not in SUPPORTED:
        raise ValueError(f"{group.where(call)}: dtype {array.dtype.name} is not supported; "
                         f"use one of {', '.join(SUPPORTED_DTYPES)} "
                         "(e.g. .astype(np.float32)).")
    if not array.flags.c_contiguous:
        raise ValueError(f"{group.where(call)}: the array (shape {tuple(array.shape)}, strides "
                         f"{tuple(array.strides)}) is not C-contiguous, so it cannot be "
                         "reduced in place. Pass np.ascontiguousarray(x) and copy the result back.")
    if writable and not getattr(array.flags, "writeable", True):
        raise ValueError(f"{group.where(call)}: the array is read-only (flags.writeable is "
                         "False) but the result is written into it. Pass a writable copy "
                         "(x.copy()).")
    return array if array.ndim == 1 else array.reshape(-1)


def root_rank(group: Any, root: Any, name: str, call: str) -> int:
    """``root`` (a src or dst) as an int, if it is a rank of the group."""
    if isinstance(root, bool) or not isinstance(root, (int, np.integer)) or \
            not 0 <= root < group.size:
        raise ValueError(f"{group.where(call)}: {name}={root!r} is out of range; it must be "
                         f"a rank in [0, {group.size}).")
    return int(root)


def reduce_op(group: Any, op: Any, call: str) -> ReduceOp:
    """``op`` ("sum", "avg", ..., or a ReduceOp) as a ReduceOp."""
    try:
        return FAST_OPS[op]
    except (KeyError, TypeError):
        pass
    try:
        return parse_op(op)
    except ValueError as e:
        raise ValueError(f"{group.where(call)}: {e}.") from None


def stream_tag(group: Any, tag: Any, call: str) -> int:
    """``tag`` as a stream number, ``0 <= tag < MAX_STREAMS``."""
    if isinstance(tag, bool) or not isinstance(tag, (int, np.integer)) or \
            not 0 <= tag < MAX_STREAMS:
        raise ValueError(f"{group.where(call)}: tag={tag!r} is out of range; a stream tag "
                         f"must be an integer in [0, {MAX_STREAMS}).")
    return int(tag)


__all__ = ["flat_view", "root_rank", "reduce_op", "stream_tag", "FAST_OPS"]
