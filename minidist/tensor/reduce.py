"""Reductions: sum, mean (axis int or tuple, keepdims) and max/min along one axis.

The backward of a reduction broadcasts the output gradient back over the reduced axes::

    x (2, 3) --sum(axis=1)--> out (2,)        grad x = broadcast(g[:, None], (2, 3))

max/min send the gradient to one winner per slice (the first argmax on ties), like torch's
``max(dim)``.
"""

from __future__ import annotations

import builtins
import math
from typing import Any, NamedTuple

from minidist import xp as backend
from minidist.tensor.autocast_mode import autocast_args
from minidist.tensor.core import Tensor, error


def normalize_axes(op: str, axis: Any, ndim: int) -> tuple[int, ...]:
    """``axis`` (None, int or tuple; negatives allowed) as a sorted tuple of non-negative ints."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    out = []
    for ax in axes:
        if not -ndim <= ax < builtins.max(ndim, 1):
            raise ValueError(error(op, f"axis {ax} is out of range for a tensor with {ndim} "
                                   f"dims (valid: {-ndim}..{ndim - 1})."))
        out.append(ax % ndim if ndim else 0)
    return tuple(sorted(set(out)))


def _expand(g: Any, shape: tuple[int, ...], axes: tuple[int, ...], keepdims: bool) -> Any:
    """Broadcast a reduction's output gradient back to the input shape (a read-only view)."""
    xp = backend.get_array_module(g)
    if not keepdims:
        g = g.reshape(tuple(1 if i in axes else n for i, n in enumerate(shape)))
    return xp.broadcast_to(g, shape)


def sum(x: Tensor, axis: Any = None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """Sum over ``axis`` (all axes by default; in float32 under autocast)."""
    (x,) = autocast_args("sum", x)
    axes = normalize_axes("sum", axis, x.ndim)
    out = x.data.sum(axis=axes, keepdims=keepdims)
    shape = x.data.shape
    return Tensor._make(out, (x,), lambda g: (_expand(g, shape, axes, keepdims),), "sum")


def mean(x: Tensor, axis: Any = None, keepdims: bool = False) -> Tensor:
    """Mean over ``axis`` (all axes by default)."""
    axes = normalize_axes("mean", axis, x.ndim)
    out = x.data.mean(axis=axes, keepdims=keepdims)
    shape = x.data.shape
    count = math.prod(shape[i] for i in axes)
    return Tensor._make(out, (x,), lambda g: (_expand(g / count, shape, axes, keepdims),), "mean")


def max(x: Tensor, axis: int | None = None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """Maximum over all elements, or along one axis; the gradient goes to the argmax."""
    xp = backend.get_array_module(x.data)
    shape = x.data.shape
    if axis is None:
        flat = x.data.reshape(-1)
        i = flat.argmax()  # stays on the device: int() here would synchronize
        out = flat[i].reshape((1,) * x.ndim if keepdims else ())

        def backward_all(g: Any) -> tuple:
            gx = xp.zeros(x.data.size, dtype=g.dtype)
            gx[i] = g.reshape(())
            return (gx.reshape(shape),)

        return Tensor._make(out, (x,), backward_all, "max")
    if not isinstance(axis, int):
        raise ValueError(error("max", f"axis must be an int or None, got {axis!r}. Reduce one "
                               "axis at a time, or reshape first."))
    (ax,) = normalize_axes("max", axis, x.ndim)
    moved = xp.moveaxis(x.data, ax, -1)
    rows = moved.reshape(-1, moved.shape[-1])
    idx = rows.argmax(axis=1)
    r = xp.arange(rows.shape[0])
    out = rows[r, idx].reshape(moved.shape[:-1])
    if keepdims:
        out = xp.expand_dims(out, ax)

    def backward(g: Any) -> tuple:
        grows = xp.zeros(rows.shape, dtype=g.dtype)
        grows[r, idx] = g.reshape(-1)
        return (xp.moveaxis(grows.reshape(moved.shape), -1, ax),)

    return Tensor._make(out, (x,), backward, "max")


def min(x: Tensor, axis: int | None = None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """Minimum (as ``-max(-x)``); the gradient goes to the argmin."""
    return -max(-x, axis, keepdims)


class ValuesIndices(NamedTuple):
    """torch's ``max(dim)``/``min(dim)`` result: ``values, indices = x.max(1)``."""

    values: Tensor
    indices: Tensor


def argmax(x: Tensor, axis: int | None = None, keepdims: bool = False) -> Tensor:
    """Index of the maximum (flattened when ``axis`` is None), int64, outside the tape."""
    xp = backend.get_array_module(x.data)
    out = x.data.argmax(axis=axis)
    if keepdims:
        out = out.reshape((1,) * x.ndim) if axis is None else xp.expand_dims(out, axis)
    return Tensor(out.astype("int64", copy=False))


def argmin(x: Tensor, axis: int | None = None, keepdims: bool = False) -> Tensor:
    """Index of the minimum (flattened when ``axis`` is None), int64, outside the tape."""
    xp = backend.get_array_module(x.data)
    out = x.data.argmin(axis=axis)
    if keepdims:
        out = out.reshape((1,) * x.ndim) if axis is None else xp.expand_dims(out, axis)
    return Tensor(out.astype("int64", copy=False))


def max_dim(x: Tensor, dim: int, keepdim: bool = False) -> ValuesIndices:
    """torch's ``x.max(dim)``: the maxima along ``dim`` (on the tape) and where they are."""
    return ValuesIndices(max(x, dim, keepdim), argmax(x, dim, keepdim))


def min_dim(x: Tensor, dim: int, keepdim: bool = False) -> ValuesIndices:
    """torch's ``x.min(dim)``: the minima along ``dim`` (on the tape) and where they are."""
    return ValuesIndices(min(x, dim, keepdim), argmin(x, dim, keepdim))


def topk(x: Tensor, k: int, dim: int = -1, largest: bool = True,
         sorted: bool = True) -> ValuesIndices:  # noqa: A002 - torch's name
    """torch's ``topk``: the ``k`` largest (or smallest) entries along ``dim`` and where they are.

    ``values`` is on the tape (its gradient goes back to the chosen positions); ``indices`` is
    int64. The result is always sorted (largest first, or smallest first with
    ``largest=False``), which ``sorted=False`` allows; ties keep the lower index first.
    """
    xp = backend.get_array_module(x.data)
    data = x.data if x.ndim else x.data.reshape(1)
    (ax,) = normalize_axes("topk", dim, data.ndim)
    if not 0 <= k <= data.shape[ax]:
        raise ValueError(error("topk", f"k={k} is out of range for dim {dim} of size "
                               f"{data.shape[ax]} (valid: 0..{data.shape[ax]})."))
    if data.dtype.kind == "b":
        key = ~data if largest else data
    else:
        key = -data if largest else data
    idx = xp.take(xp.argsort(key, axis=ax, kind="stable"), xp.arange(k), axis=ax)
    values = xp.take_along_axis(data, idx, axis=ax)
    shape = x.data.shape

    def backward(g: Any) -> tuple:
        # scatter g back to the chosen positions, with ``ax`` moved last: row r of the
        # (rows, n) gradient gets g's row r at the k columns idx's row r names
        if k == 0:
            return (xp.zeros(shape, dtype=g.dtype),)
        moved = xp.moveaxis(idx, ax, -1).reshape(-1, k)
        gm = xp.zeros((moved.shape[0], data.shape[ax]), dtype=g.dtype)
        rows = xp.arange(moved.shape[0]).reshape(-1, 1)
        gm[rows, moved] = xp.moveaxis(g.reshape(values.shape), ax, -1).reshape(-1, k)
        lead = tuple(n for i, n in enumerate(data.shape) if i != ax)
        return (xp.moveaxis(gm.reshape(lead + (data.shape[ax],)), -1, ax).reshape(shape),)

    out_shape = values.shape if x.ndim else ()
    return ValuesIndices(Tensor._make(values.reshape(out_shape), (x,), backward, "topk"),
                         Tensor(idx.astype("int64", copy=False).reshape(out_shape)))
