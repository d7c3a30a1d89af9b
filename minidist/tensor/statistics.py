"""torch's statistics and scans with torch's defaults: var, std (``correction=1``, Bessel's
correction; NumPy's ``ndarray.var``/``std`` default to ``ddof=0``), cumsum, cumprod, prod.

    x.std()                      # torch: sample std (n - 1); x.array.std() is NumPy's (n)
    x.var(dim=1, keepdim=True)
    x.cumsum(dim=0)              # torch's dim is required; NumPy's cumsum() flattens

var is built from tape ops (mean, subtract, square, sum), so its gradient is theirs; cumsum's
gradient is a reversed cumsum; prod's is the product of the other factors (exclusive products
from both sides, so zeros are handled).
"""

from __future__ import annotations

import math
from typing import Any

from minidist import xp as backend
from minidist.tensor import reduce
from minidist.tensor.core import Tensor, error


def var(input: Tensor, dim: Any = None, unbiased: Any = None, keepdim: bool = False, *,  # noqa: A002
        correction: Any = None) -> Tensor:
    """torch's ``var``: the mean squared deviation over ``dim``, divided by ``n - correction``
    (default ``correction=1``; ``unbiased=False`` means 0)."""
    if isinstance(unbiased, bool):
        correction = int(unbiased) if correction is None else correction
    elif unbiased is not None:  # torch's positional order var(input, dim, unbiased, keepdim)
        raise TypeError(error("var", f"unbiased must be a bool, got {unbiased!r}."))
    correction = 1 if correction is None else correction
    axes = reduce.normalize_axes("var", dim, input.ndim)
    n = math.prod(input.shape[i] for i in axes)
    dev = input - reduce.mean(input, axes, keepdims=True)
    return reduce.sum(dev * dev, axes, keepdim) / max(n - correction, 0)


def std(input: Tensor, dim: Any = None, unbiased: Any = None, keepdim: bool = False, *,  # noqa: A002
        correction: Any = None) -> Tensor:
    """torch's ``std``: ``sqrt(var(...))`` with the same arguments and defaults."""
    return var(input, dim, unbiased, keepdim, correction=correction) ** 0.5


def cumsum(input: Tensor, dim: int, *, dtype: Any = None) -> Tensor:  # noqa: A002
    """torch's ``cumsum`` along ``dim`` (required, as torch)."""
    x = input.array if dtype is None else input.array.astype(dtype)
    (d,) = reduce.normalize_axes("cumsum", dim, input.ndim) if input.ndim else (0,)
    xp = backend.get_array_module(x)
    if x.ndim == 0:
        return Tensor._make(x.copy(), (input,), lambda g: (g,), "cumsum")

    def backward(g: Any) -> tuple:
        return (xp.flip(xp.cumsum(xp.flip(g, d), axis=d), d),)

    return Tensor._make(xp.cumsum(x, axis=d), (input,), backward, "cumsum")


def _exclusive_cumprod(x: Any, d: int, reverse: bool) -> Any:
    xp = backend.get_array_module(x)
    if reverse:
        return xp.flip(_exclusive_cumprod(xp.flip(x, d), d, False), d)
    ones = xp.ones_like(xp.take(x, [0], axis=d))
    return xp.cumprod(xp.concatenate([ones, xp.take(x, range(x.shape[d] - 1), axis=d)], d), d)


def cumprod(input: Tensor, dim: int, *, dtype: Any = None) -> Tensor:  # noqa: A002
    """torch's ``cumprod`` along ``dim``; the gradient is exact where inputs are zero too."""
    x = input.array if dtype is None else input.array.astype(dtype)
    (d,) = reduce.normalize_axes("cumprod", dim, input.ndim) if input.ndim else (0,)
    xp = backend.get_array_module(x)
    if x.ndim == 0:
        return Tensor._make(x.copy(), (input,), lambda g: (g,), "cumprod")
    n = x.shape[d]
    out = xp.cumprod(x, axis=d)

    def backward(g: Any) -> tuple:  # d out_j / d x_i = prod_{k<=j, k!=i} x_k, for j >= i
        if bool((x != 0).all()):  # the reversed cumsum of g * out, divided by x
            return (xp.flip(xp.cumsum(xp.flip(g * out, d), axis=d), d) / x,)
        gx = xp.zeros_like(x)  # with zeros: each x_i's column of products, exactly
        for i in range(n):
            sel = [slice(None)] * x.ndim
            sel[d] = slice(i, n)
            tail = xp.take(x, range(i + 1, n), axis=d)
            before = xp.take(_exclusive_cumprod(x, d, False), [i], axis=d)
            after = xp.cumprod(xp.concatenate([xp.ones_like(before), tail], d), d)
            sel_i = [slice(None)] * x.ndim
            sel_i[d] = slice(i, i + 1)
            gx[tuple(sel_i)] = (g[tuple(sel)] * before * after).sum(axis=d, keepdims=True)
        return (gx,)

    return Tensor._make(out, (input,), backward, "cumprod")


def prod(input: Tensor, dim: int | None = None, keepdim: bool = False, *,  # noqa: A002
         dtype: Any = None) -> Tensor:
    """torch's ``prod`` over all elements or one ``dim``."""
    x = input.array if dtype is None else input.array.astype(dtype)
    flat = dim is None
    d = 0 if flat else reduce.normalize_axes("prod", dim, input.ndim)[0]
    xs = x.reshape(-1) if flat else x
    out = xs.prod(axis=d, keepdims=keepdim and not flat)

    def backward(g: Any) -> tuple:
        others = _exclusive_cumprod(xs, d, False) * _exclusive_cumprod(xs, d, True)
        xp = backend.get_array_module(g)
        gg = g if (flat or keepdim) else xp.expand_dims(g, d)
        return ((gg * others).reshape(x.shape),)

    return Tensor._make(out, (input,), backward, "prod")


__all__ = ["var", "std", "cumsum", "cumprod", "prod"]
