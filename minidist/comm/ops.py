"""Reduction operators: the ``ReduceOp`` enum and the in-place kernels every algorithm uses.

    from minidist.comm.ops import ReduceOp, parse_op, combine, finalize
    op = parse_op("avg")              # strings or ReduceOp members
    combine(acc, incoming, op)        # acc <- acc (op) incoming, in place, no allocation
    finalize(buf, op, world_size)     # AVG only: divide the finished sum by world_size

Contract:
- ``combine`` writes into ``acc`` with an in-place ufunc (``np.add(acc, x, out=acc)``); both
  arrays have the same dtype and length. The ufunc is commutative bit for bit (IEEE ``a+b ==
  b+a``), which recursive doubling relies on for identical results on every rank.
- AVG is SUM followed by one division on every rank (each rank divides identical bits, so the
  result stays identical). Integer AVG is **floor division** (``np.floor_divide``, rounding toward
  minus infinity, like Python's ``//``): ``avg([1, 2]) == 1`` and ``avg([-1, -2]) == -2``.
- float16 is accumulated in float16, so a sum over many ranks loses more precision than a
  float32 sum would; the result is still the same on every rank.
"""

from __future__ import annotations

import enum
from typing import Any

import numpy as np

from minidist import xp as backend

SUPPORTED_DTYPES = ("float16", "float32", "float64", "int32", "int64")


class ReduceOp(enum.Enum):
    """How ``all_reduce``/``reduce``/``reduce_scatter`` combine the ranks' arrays (torch names)."""

    SUM = "sum"
    AVG = "avg"
    MAX = "max"
    MIN = "min"
    PROD = "prod"

    # Set on every member below (annotations only: they are not members). Read on the hot
    # path: hashing an Enum member runs Python code, reading an attribute does not.
    code: int  # a small int, the same in every process (the calls' fingerprints use it)
    ufunc: Any  # how ``combine`` reduces; AVG combines like SUM and divides at the end
    averages: bool  # AVG: ``finalize`` divides (``op.averages``, not ``op is ReduceOp.AVG``,
    #                 whose class lookup costs three times as much)


_UFUNCS = {"sum": np.add, "avg": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}
for _i, _o in enumerate(ReduceOp):
    _o.code = _i + 1
    _o.ufunc = _UFUNCS[_o.value]
    _o.averages = _o.value == "avg"

_BY_NAME = {o.value: o for o in ReduceOp}
SUPPORTED = frozenset(np.dtype(d) for d in SUPPORTED_DTYPES)  # np.dtype hashes fast; .name doesn't


def parse_op(op: str | ReduceOp) -> ReduceOp:
    """Turn ``"sum"``/``ReduceOp.SUM`` (any case) into a ``ReduceOp``.

    Raises:
        ValueError: for an unknown name, listing the valid ones.
    """
    if isinstance(op, ReduceOp):
        return op
    fast = _BY_NAME.get(op) if isinstance(op, str) else None  # the hot path: "sum", "avg"
    if fast is not None:
        return fast
    if isinstance(op, str):
        try:
            return ReduceOp(op.lower())
        except ValueError:
            pass
    valid = ", ".join(repr(o.value) for o in ReduceOp)
    raise ValueError(f"unknown reduce op {op!r}; use one of {valid} or a minidist.ReduceOp member")


def check_dtype(dtype: Any) -> np.dtype:
    """Return ``np.dtype(dtype)`` if collectives support it, else raise ValueError."""
    dt = np.dtype(dtype)
    if dt.name not in SUPPORTED_DTYPES:
        raise ValueError(f"unsupported dtype {dt.name}; collectives support "
                         f"{', '.join(SUPPORTED_DTYPES)} (cast with array.astype(np.float32) first)")
    return dt


def combine(acc: Any, incoming: Any, op: ReduceOp) -> None:
    """``acc <- acc (op) incoming`` in place (no temporary array); NumPy or CuPy arrays."""
    ufunc = op.ufunc
    if type(acc) is not np.ndarray:  # CuPy: use its own ufunc of the same name
        ufunc = getattr(backend.get_array_module(acc), ufunc.__name__)
    ufunc(acc, incoming, out=acc)


def finalize(buf: Any, op: ReduceOp, world_size: int) -> None:
    """Finish a reduction in place: AVG divides the sum by ``world_size``; other ops do nothing.

    Integer arrays use floor division (see the module docstring).
    """
    if not op.averages or world_size == 1 or buf.size == 0:
        return
    if buf.dtype.kind in "iu":  # (in-place operators: NumPy and CuPy alike)
        buf //= world_size
    elif world_size & (world_size - 1) == 0:  # 1/n exact: the same bits as "/", cheaper
        buf *= buf.dtype.type(1 / world_size)
    else:
        buf /= buf.dtype.type(world_size)


def reference_reduce(arrays: list, op: str | ReduceOp) -> np.ndarray:
    """The NumPy oracle: reduce a list of equal-shape arrays in rank order (used by tests)."""
    op = parse_op(op)
    out = np.array(arrays[0], copy=True)
    for a in arrays[1:]:
        combine(out, a, op)
    finalize(out, op, len(arrays))
    return out
