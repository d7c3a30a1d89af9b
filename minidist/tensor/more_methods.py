"""torch's everyday Tensor methods and functions that NumPy spells otherwise or lacks: matmul,
mm, bmm, comparisons, square, rsqrt, log1p, expm1, floor, ceil, flip, roll, unbind, amax/amin,
logsumexp, movedim, tile, outer, the is*/logical* predicates, clamp_min/clamp_max, diff, lerp,
and scatter/scatter_add/index_add/masked_fill/lerp in place (``scatter_``...).

    x.matmul(w), x.lt(0), x.flip(1), x.roll(1, dims=0), x.unbind(0), x.logsumexp(dim=-1)

Most are compositions of tape ops (their gradient is the ops'); the few with an array
formula (log1p, expm1, flip, roll, amax/amin) carry their backward beside them. amax/amin
share the gradient evenly between tied maxima, as torch's do (``max(dim)`` sends it to one).
Predicates and comparisons are bool tensors off the tape.
"""

from __future__ import annotations

from typing import Any

import numpy

from minidist import xp as backend
from minidist.tensor import elementwise, indexing, inplace, linalg, mathops, reduce
from minidist.tensor import shape as shape_ops
from minidist.tensor.core import Tensor, error
from minidist.tensor.grad_mode import no_grad


def _t(v: Any, like: Tensor) -> Tensor:
    return v if isinstance(v, Tensor) else Tensor(backend.get_array_module(like.array).asarray(
        v, dtype=like.array.dtype))


def matmul(self: Tensor, other: Any) -> Tensor:
    return linalg.matmul(self, other)


def mm(self: Tensor, mat2: Any) -> Tensor:
    """torch's ``mm``: 2-D by 2-D only."""
    mat2 = _t(mat2, self)
    if self.ndim != 2 or mat2.ndim != 2:
        raise RuntimeError(error("mm", f"self must be a matrix (got {self.ndim}-D) and so must "
                                 f"mat2 (got {mat2.ndim}-D); use matmul or bmm."))
    return linalg.matmul(self, mat2)


def bmm(self: Tensor, mat2: Any) -> Tensor:
    """torch's ``bmm``: (b, n, m) @ (b, m, p), 3-D only."""
    mat2 = _t(mat2, self)
    if self.ndim != 3 or mat2.ndim != 3:
        raise RuntimeError(error("bmm", f"batch1 and batch2 must be 3-D, got {self.ndim}-D and "
                                 f"{mat2.ndim}-D."))
    return linalg.matmul(self, mat2)


def outer(self: Tensor, vec2: Any) -> Tensor:
    vec2 = _t(vec2, self)
    return shape_ops.reshape(self, -1, 1) * shape_ops.reshape(vec2, 1, -1)


def _unary(op: str, fn: str, grad: Any) -> Any:
    def method(self: Tensor) -> Tensor:
        xp = backend.get_array_module(self.array)
        x = self.array
        return Tensor._make(getattr(xp, fn)(x), (self,), lambda g: (grad(xp, x, g),), op)
    method.__name__ = op
    method.__doc__ = f"torch's ``{op}``, with its gradient."
    return method


log1p = _unary("log1p", "log1p", lambda xp, x, g: g / (1 + x))
expm1 = _unary("expm1", "expm1", lambda xp, x, g: g * xp.exp(x))
floor = _unary("floor", "floor", lambda xp, x, g: xp.zeros_like(g))
ceil = _unary("ceil", "ceil", lambda xp, x, g: xp.zeros_like(g))
trunc = _unary("trunc", "trunc", lambda xp, x, g: xp.zeros_like(g))


def square(self: Tensor) -> Tensor:
    return self * self


def rsqrt(self: Tensor) -> Tensor:
    return elementwise.pow(self, -0.5)


def reciprocal(self: Tensor) -> Tensor:
    return elementwise.rdiv(self, 1.0)


def _dims(dims: Any) -> tuple[int, ...]:
    return (dims,) if isinstance(dims, int) else tuple(dims)


def flip(self: Tensor, *dims: Any) -> Tensor:
    """torch's ``flip(dims)``: reverse the order along ``dims``."""
    axes = _dims(dims[0] if len(dims) == 1 else dims)
    xp = backend.get_array_module(self.array)
    return Tensor._make(xp.flip(self.array, axes), (self,), lambda g: (xp.flip(g, axes),),
                        "flip")


def roll(self: Tensor, shifts: Any, dims: Any = None) -> Tensor:
    """torch's ``roll``: shift elements along ``dims`` (flattened when None), wrapping around."""
    xp = backend.get_array_module(self.array)
    neg = tuple(-s for s in _dims(shifts)) if not isinstance(shifts, int) else -shifts
    return Tensor._make(xp.roll(self.array, shifts, dims), (self,),
                        lambda g: (xp.roll(g, neg, dims),), "roll")


def unbind(self: Tensor, dim: int = 0) -> tuple[Tensor, ...]:
    """torch's ``unbind``: the slices along ``dim``, each without that dim."""
    d = dim % max(self.ndim, 1)
    return tuple(self[(slice(None),) * d + (i,)] for i in range(self.shape[d]))


def movedim(self: Tensor, source: Any, destination: Any) -> Tensor:
    """torch's ``movedim`` (NumPy's ``moveaxis``), as a permutation on the tape."""
    src = [s % self.ndim for s in _dims(source)]
    dst = [d % self.ndim for d in _dims(destination)]
    order = [i for i in range(self.ndim) if i not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return shape_ops.transpose(self, tuple(order))


def tile(self: Tensor, *dims: Any) -> Tensor:
    """torch's ``tile``: ``repeat`` with ones prepended to ``dims`` when it is shorter."""
    reps = _dims(dims[0] if len(dims) == 1 else dims)
    return indexing.repeat(self, *((1,) * (self.ndim - len(reps)) + reps))


def _extreme(op: str, self: Tensor, dim: Any, keepdim: bool) -> Tensor:
    x = self.array
    axes = reduce.normalize_axes(op, dim, x.ndim) if not (
        isinstance(dim, (tuple, list)) and len(dim) == 0) else tuple(range(x.ndim))
    kept = x.max(axis=axes, keepdims=True) if op == "amax" else x.min(axis=axes, keepdims=True)
    out = kept if keepdim else kept.reshape([n for i, n in enumerate(x.shape) if i not in axes])

    def backward(g: Any) -> tuple:
        hit = (x == kept).astype(g.dtype)
        gk = g if keepdim else g.reshape(kept.shape)
        return (gk * hit / hit.sum(axis=axes, keepdims=True),)

    return Tensor._make(out, (self,), backward, op)


def amax(self: Tensor, dim: Any = (), keepdim: bool = False) -> Tensor:
    """torch's ``amax``: the maximum over ``dim`` (all dims by default); ties share the
    gradient evenly."""
    return _extreme("amax", self, None if dim == () else dim, keepdim)


def amin(self: Tensor, dim: Any = (), keepdim: bool = False) -> Tensor:
    return _extreme("amin", self, None if dim == () else dim, keepdim)


def logsumexp(self: Tensor, dim: Any, keepdim: bool = False) -> Tensor:
    """torch's ``logsumexp`` over ``dim``, stable (the maximum is subtracted first)."""
    axes = reduce.normalize_axes("logsumexp", dim, self.ndim)
    xp = backend.get_array_module(self.array)
    m = self.array.max(axis=axes, keepdims=True)
    m = xp.where(xp.isfinite(m), m, 0)
    inner = elementwise.exp(self - Tensor(m))
    out = elementwise.log(reduce.sum(inner, axes, keepdims=True)) + Tensor(m)
    return out if keepdim else shape_ops.reshape(
        out, *[n for i, n in enumerate(self.shape) if i not in axes])


def _predicate(fn: str) -> Any:
    def method(self: Tensor) -> Tensor:
        return Tensor(getattr(backend.get_array_module(self.array), fn)(self.array))
    method.__name__ = fn
    return method


def _logical(fn: str) -> Any:
    def method(self: Tensor, other: Any) -> Tensor:
        o = other.array if isinstance(other, Tensor) else other
        return Tensor(getattr(backend.get_array_module(self.array), fn)(self.array, o))
    method.__name__ = fn
    return method


# ---- scatter, index_add, masked_fill, lerp: out of place with gradients, and in place with
# torch's autograd rules (inplace.apply: refused on a leaf that requires grad in grad mode,
# written into the tensor's own array off the tape, recorded on it) --------------------------


def _in_place(op: str, compute: Any) -> Any:
    def method(self: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        operands = [a for a in list(args) + list(kwargs.values()) if isinstance(a, Tensor)]

        def fast() -> None:
            with no_grad():
                res = compute(Tensor(self.array), *args, **kwargs).array
            self.array[...] = res.astype(self.array.dtype, copy=False)

        return inplace.apply(self, op, lambda old: compute(old, *args, **kwargs), fast,
                             *operands)
    method.__name__ = op
    method.__doc__ = f"torch's in-place ``{op}``."
    return method


def scatter_add(self: Tensor, dim: int, index: Any, src: Any) -> Tensor:
    return indexing.scatter(self, dim, index, src, reduce="add")


def lerp(self: Tensor, end: Any, weight: Any) -> Tensor:
    """torch's ``lerp``: ``self + weight * (end - self)`` (an EMA: ``ema.lerp_(p, 1 - decay)``)."""
    return self + (_t(end, self) - self) * weight


def diff(self: Tensor, n: int = 1, dim: int = -1) -> Tensor:
    """torch's ``diff``: the ``n``-th forward difference along ``dim``."""
    out = self
    d = dim % self.ndim
    for _ in range(n):
        lo = (slice(None),) * d + (slice(None, -1),)
        hi = (slice(None),) * d + (slice(1, None),)
        out = out[hi] - out[lo]
    return out


def type_as(self: Tensor, other: Tensor) -> Tensor:
    return elementwise.astype(self, other.array.dtype)


def reshape_as(self: Tensor, other: Tensor) -> Tensor:
    return shape_ops.reshape(self, *other.shape)


def is_floating_point(self: Tensor) -> bool:
    return bool(numpy.issubdtype(self.array.dtype, numpy.floating)) or \
        self.dtype.is_floating_point


METHODS: dict[str, Any] = {
    "matmul": matmul, "mm": mm, "bmm": bmm, "outer": outer,
    "lt": lambda self, other: elementwise.compare("lt", self, other),
    "le": lambda self, other: elementwise.compare("le", self, other),
    "gt": lambda self, other: elementwise.compare("gt", self, other),
    "ge": lambda self, other: elementwise.compare("ge", self, other),
    "neg": elementwise.neg, "square": square, "rsqrt": rsqrt, "reciprocal": reciprocal,
    "log1p": log1p, "expm1": expm1, "floor": floor, "ceil": ceil, "trunc": trunc,
    "flip": flip, "roll": roll, "unbind": unbind, "movedim": movedim, "moveaxis": movedim,
    "tile": tile, "amax": amax, "amin": amin, "logsumexp": logsumexp,
    "isnan": _predicate("isnan"), "isinf": _predicate("isinf"),
    "isfinite": _predicate("isfinite"), "logical_not": _predicate("logical_not"),
    "logical_and": _logical("logical_and"), "logical_or": _logical("logical_or"),
    "clamp_min": lambda self, min: mathops.clamp(self, min=min),  # noqa: A002
    "clamp_max": lambda self, max: mathops.clamp(self, max=max),  # noqa: A002
    "type_as": type_as, "reshape_as": reshape_as, "is_floating_point": is_floating_point,
    "nelement": lambda self: int(self.array.size), "ndimension": lambda self: self.ndim,
    "scatter": indexing.scatter, "scatter_": _in_place("scatter_", indexing.scatter),
    "scatter_add": scatter_add, "scatter_add_": _in_place("scatter_add_", scatter_add),
    "index_add": indexing.index_add, "index_add_": _in_place("index_add_", indexing.index_add),
    "masked_fill_": _in_place("masked_fill_", elementwise.masked_fill),
    "lerp": lerp, "lerp_": _in_place("lerp_", lerp), "diff": diff,
}

__all__ = ["METHODS", "lerp", "diff", "scatter_add", "matmul", "mm", "bmm", "outer", "log1p",
           "expm1", "floor", "ceil", "square", "rsqrt", "flip", "roll", "unbind", "movedim",
           "tile", "amax", "amin", "logsumexp"]
