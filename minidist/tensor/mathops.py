"""torch's math functions beyond the arithmetic: sin cos sqrt abs clamp where norm trace.

    q = minidist.where(norm > 0, eta * norm / update_norm, one)     # LARS's trust ratio
    minidist.norm(p)                                                # 2-norm of all elements

Each computes on ``.data`` and records its backward beside its forward (``Tensor._make``), as
the ops in ``elementwise`` do; Python scalars stay weak (a float32 tensor stays float32).
"""

from __future__ import annotations

import math
from typing import Any

import numpy

from minidist import xp as backend
from minidist.tensor.core import Tensor, error
from minidist.tensor.elementwise import unbroadcast
from minidist.tensor.reduce import normalize_axes


def sin(input: Tensor) -> Tensor:  # noqa: A002 - torch's argument name
    """Sine; d/dx = cos."""
    xp = backend.get_array_module(input.data)
    return Tensor._make(xp.sin(input.data), (input,),
                        lambda g: (g * xp.cos(input.data),), "sin")


def cos(input: Tensor) -> Tensor:  # noqa: A002
    """Cosine; d/dx = -sin."""
    xp = backend.get_array_module(input.data)
    return Tensor._make(xp.cos(input.data), (input,),
                        lambda g: (-g * xp.sin(input.data),), "cos")


def sqrt(input: Tensor) -> Tensor:  # noqa: A002
    """Square root; d/dx = 1 / (2 sqrt x)."""
    out = backend.get_array_module(input.data).sqrt(input.data)
    return Tensor._make(out, (input,), lambda g: (g / (2 * out),), "sqrt")


def abs(input: Tensor) -> Tensor:  # noqa: A001,A002 - torch's name
    """Absolute value; the gradient at 0 is 0 (torch's choice)."""
    xp = backend.get_array_module(input.data)
    return Tensor._make(xp.abs(input.data), (input,),
                        lambda g: (g * xp.sign(input.data),), "abs")


def clip_array(a: Any, low: Any, high: Any) -> Any:
    """``a`` clipped into ``[low, high]`` (a bound may be None), in ``a``'s dtype."""
    xp = backend.get_array_module(a)
    out = a
    if low is not None:
        out = xp.maximum(out, low)
    if high is not None:
        out = xp.minimum(out, high)
    return out.astype(a.dtype, copy=False) if out is not a else out.copy()


def clamp(input: Tensor, min: Any = None, max: Any = None) -> Tensor:  # noqa: A001,A002
    """``input`` clipped into ``[min, max]`` (torch's clamp; also ``clip``).

    The gradient passes where ``min <= input <= max`` (bounds included, as torch) and is zero
    where the input was clipped. Bounds are numbers or tensors (no gradient to them).
    """
    if min is None and max is None:
        raise ValueError(error("clamp", "at least one of min and max must be given."))
    low = min.data if isinstance(min, Tensor) else min
    high = max.data if isinstance(max, Tensor) else max
    x = input.data
    out = clip_array(x, low, high)

    def backward(g: Any) -> tuple:
        keep = (x >= low) if low is not None else None
        if high is not None:
            keep = (x <= high) if keep is None else keep & (x <= high)
        return (unbroadcast(g * keep, x.shape),)

    return Tensor._make(out, (input,), backward, "clamp")


def where(condition: Any, input: Any = None, other: Any = None) -> Any:  # noqa: A002
    """``input`` where ``condition`` is True, ``other`` elsewhere (broadcast), as torch.where.

    ``input``/``other`` are tensors or numbers (numbers stay weak: a float32 tensor and a
    Python float give float32). The gradient goes to each side where it was chosen. With the
    condition alone, ``where(c)`` is ``c.nonzero(as_tuple=True)``: a tuple of int64 index
    tensors, outside the tape.
    """
    cond = condition.data if isinstance(condition, Tensor) else condition
    if input is None and other is None:
        xp = backend.get_array_module(cond)
        return tuple(Tensor(i.astype(numpy.int64)) for i in xp.nonzero(xp.asarray(cond)))
    if input is None or other is None:
        raise TypeError(error("where", "takes (condition) or (condition, input, other)."))
    tensors = [t for t in (input, other) if isinstance(t, Tensor)]
    like = tensors[0].data if tensors else None
    xp = backend.get_array_module(like if like is not None else cond)
    cond = xp.asarray(cond)
    if cond.dtype != numpy.bool_:
        raise TypeError(error("where", f"condition must be a bool tensor, got dtype "
                              f"{cond.dtype}. Build it with a comparison (x > 0)."))
    a = input.data if isinstance(input, Tensor) else input
    b = other.data if isinstance(other, Tensor) else other
    try:
        out = xp.where(cond, a, b)
    except ValueError:
        shapes = [tuple(numpy.shape(v)) for v in (cond, a, b)]
        raise ValueError(error("where", f"shapes {shapes} (condition, input, other) cannot be "
                               "broadcast together.")) from None
    if not tensors:
        return Tensor(out)
    if isinstance(input, Tensor) and isinstance(other, Tensor):
        out = out.astype(numpy.result_type(input.data, other.data), copy=False)
    elif like is not None and out.dtype != like.dtype and numpy.dtype(like.dtype).kind == "f":
        out = out.astype(like.dtype)  # a float tensor and a Python number: the tensor's dtype

    def backward(g: Any) -> tuple:
        zero = xp.zeros((), dtype=g.dtype)
        ga = unbroadcast(xp.where(cond, g, zero), numpy.shape(a)) \
            if isinstance(input, Tensor) else None
        gb = unbroadcast(xp.where(cond, zero, g), numpy.shape(b)) \
            if isinstance(other, Tensor) else None
        return tuple(v for v, t in ((ga, input), (gb, other)) if isinstance(t, Tensor))

    return Tensor._make(out, tuple(tensors), backward, "where")


def norm(input: Tensor, p: Any = "fro", dim: Any = None, keepdim: bool = False,  # noqa: A002
         dtype: Any = None) -> Tensor:
    """torch.norm: the vector p-norm of all elements, or along ``dim``.

    ``p``: ``"fro"`` or 2 (the default: square root of the sum of squares), 1, ``inf``,
    ``-inf``, 0 (count of non-zeros) or any other number (``(sum |x|^p)^(1/p)``). The 2-norm's
    gradient is ``g * x / norm``, and 0 where the norm is 0 (as torch). ``"nuc"`` (matrix
    norms) is not supported.
    """
    x = input if dtype is None else input.astype(dtype)
    axes = normalize_axes("norm", dim, x.ndim) if dim is not None else None
    if p in ("fro", 2, 2.0):
        xp = backend.get_array_module(x.data)
        out = xp.sqrt((x.data * x.data).sum(axis=axes, keepdims=keepdim))

        def backward(g: Any) -> tuple:
            n, gk = out, g
            if not keepdim and axes is not None:
                n, gk = xp.expand_dims(out, axes), xp.expand_dims(g, axes)
            safe = xp.where(n == 0, 1, n)
            return (xp.where(n == 0, 0, gk / safe) * x.data,)

        return Tensor._make(out, (x,), backward, "norm")
    if p == "nuc":
        raise ValueError(error("norm", "p='nuc' (the nuclear matrix norm) is not supported; "
                               "use p='fro' or a vector norm."))
    if not isinstance(p, (int, float)):
        raise ValueError(error("norm", f"p must be 'fro' or a number, got {p!r}."))
    if p == math.inf:
        return abs(x).max(axis=axes, keepdims=keepdim)
    if p == -math.inf:
        return abs(x).min(axis=axes, keepdims=keepdim)
    if p == 0:
        return Tensor((x.data != 0).sum(axis=axes, keepdims=keepdim).astype(x.data.dtype))
    if p == 1:
        return abs(x).sum(axes, keepdim)
    return (abs(x) ** p).sum(axes, keepdim) ** (1.0 / p)


def trace(input: Tensor) -> Tensor:  # noqa: A002
    """Sum of the main diagonal of a 2-D tensor (torch.trace); the gradient is ``g * eye``."""
    if input.ndim != 2:
        raise ValueError(error("trace", f"expects a 2-D tensor, got shape {input.shape}."))
    xp = backend.get_array_module(input.data)
    out = xp.trace(input.data)
    rows, cols = input.shape
    return Tensor._make(xp.asarray(out), (input,),
                        lambda g: (g * xp.eye(rows, cols, dtype=g.dtype),), "trace")

