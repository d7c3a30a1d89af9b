"""Element-wise ops with broadcasting: + - * / ** neg, exp, log, tanh, sigmoid, relu, gelu, astype.

Each op computes on ``.array`` and hands ``Tensor._make`` a closure ``g -> grads`` (micrograd
shape). Broadcasting follows NumPy; a gradient flowing back to a broadcast input is summed
over the broadcast dimensions (``unbroadcast``)::

    a (3, 1) + b (1, 4) -> out (3, 4);   grad a = g.sum(axis=1, keepdims=True)   (3, 1)
                                         grad b = g.sum(axis=0, keepdims=True)   (1, 4)

Python scalars stay Python scalars (NumPy 2 treats them as "weak", so float16/float32 tensors
keep their dtype); NumPy arrays and scalars are cast to the tensor's float dtype first.
"""

from __future__ import annotations

import math
from typing import Any

import numpy

from minidist import xp as backend
from minidist.tensor.autocast_mode import autocast_args
from minidist.tensor.core import Tensor, error, is_floating
from minidist.tensor.deterministic import array_math

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def unbroadcast(g: Any, shape: tuple[int, ...]) -> Any:
    """Sum ``g`` down to ``shape``: the gradient of broadcasting an input of ``shape``."""
    if g.shape == shape:
        return g
    extra = g.ndim - len(shape)
    if extra:
        g = g.sum(axis=tuple(range(extra)))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    if axes:
        g = g.sum(axis=axes, keepdims=True)
    return g


def coerce(other: Any, like: Tensor) -> Any:
    """A Tensor, or a Python scalar left as is; arrays take ``like``'s float dtype."""
    if isinstance(other, Tensor):
        return other
    if type(other) in (int, float):  # not bool, not numpy.float64 (a float subclass, not weak)
        return other
    dtype = like.array.dtype if is_floating(like.array.dtype) else None
    return Tensor(other, dtype=dtype)


def broadcast_message(op: str, a: tuple[int, ...], b: tuple[int, ...]) -> str:
    """The error for shapes that do not broadcast, naming the first clashing dimension."""
    for k in range(1, min(len(a), len(b)) + 1):
        if a[-k] != b[-k] and a[-k] != 1 and b[-k] != 1:
            return error(op, f"shapes {a} and {b} cannot be broadcast together: dim -{k} is "
                         f"{a[-k]} on the left and {b[-k]} on the right (sizes must be equal or "
                         "one of them 1). Reshape one side, e.g. x[:, None] or .reshape(...).")
    return error(op, f"shapes {a} and {b} cannot be broadcast together.")


def _binary(op: str, fn: Any, a: Tensor, b: Tensor) -> Any:
    try:
        return fn(a.array, b.array)
    except ValueError:
        raise ValueError(broadcast_message(op, a.shape, b.shape)) from None


def add(a: Tensor, b: Any) -> Tensor:
    """``a + b`` with broadcasting."""
    b = coerce(b, a)
    if not isinstance(b, Tensor):
        return Tensor._make(a.array + b, (a,), lambda g: (g,), "add")
    out = _binary("add", lambda x, y: x + y, a, b)
    return Tensor._make(out, (a, b), lambda g: (unbroadcast(g, a.array.shape),
                                                 unbroadcast(g, b.array.shape)), "add")


def sub(a: Tensor, b: Any) -> Tensor:
    """``a - b`` with broadcasting."""
    b = coerce(b, a)
    if not isinstance(b, Tensor):
        return Tensor._make(a.array - b, (a,), lambda g: (g,), "sub")
    out = _binary("sub", lambda x, y: x - y, a, b)
    return Tensor._make(out, (a, b), lambda g: (unbroadcast(g, a.array.shape),
                                                 unbroadcast(-g, b.array.shape)), "sub")


def rsub(a: Tensor, b: Any) -> Tensor:
    """``b - a`` (b on the left)."""
    b = coerce(b, a)
    if isinstance(b, Tensor):
        return sub(b, a)
    return Tensor._make(b - a.array, (a,), lambda g: (-g,), "rsub")


def mul(a: Tensor, b: Any) -> Tensor:
    """``a * b`` with broadcasting."""
    b = coerce(b, a)
    if not isinstance(b, Tensor):
        return Tensor._make(a.array * b, (a,), lambda g: (g * b,), "mul")
    out = _binary("mul", lambda x, y: x * y, a, b)

    def backward(g: Any) -> tuple:
        ga = unbroadcast(g * b.array, a.array.shape) if a.requires_grad else None
        gb = unbroadcast(g * a.array, b.array.shape) if b.requires_grad else None
        return ga, gb

    return Tensor._make(out, (a, b), backward, "mul")


def div(a: Tensor, b: Any) -> Tensor:
    """``a / b`` with broadcasting."""
    b = coerce(b, a)
    if not isinstance(b, Tensor):
        return Tensor._make(a.array / b, (a,), lambda g: (g / b,), "div")
    out = _binary("div", lambda x, y: x / y, a, b)

    def backward(g: Any) -> tuple:
        ga = unbroadcast(g / b.array, a.array.shape) if a.requires_grad else None
        gb = unbroadcast(-g * out / b.array, b.array.shape) if b.requires_grad else None
        return ga, gb

    return Tensor._make(out, (a, b), backward, "div")


def rdiv(a: Tensor, b: Any) -> Tensor:
    """``b / a`` (b on the left)."""
    b = coerce(b, a)
    if isinstance(b, Tensor):
        return div(b, a)
    out = b / a.array
    return Tensor._make(out, (a,), lambda g: (-g * out / a.array,), "rdiv")


def neg(a: Tensor) -> Tensor:
    """``-a``."""
    return Tensor._make(-a.array, (a,), lambda g: (-g,), "neg")


def pow(a: Tensor, exponent: Any) -> Tensor:  # noqa: A001 - the op's name
    """``a ** exponent``: a Python scalar exponent, or a tensor one (then ``a`` must be > 0)."""
    (a,) = autocast_args("pow", a)
    exponent = coerce(exponent, a)
    if not isinstance(exponent, Tensor):
        p = exponent
        out = a.array ** p
        return Tensor._make(out, (a,), lambda g: (g * (p * a.array ** (p - 1)),), "pow")
    e = exponent
    out = _binary("pow", lambda x, y: x ** y, a, e)

    def backward(g: Any) -> tuple:
        xp = backend.get_array_module(out)
        ga = unbroadcast(g * e.array * a.array ** (e.array - 1), a.array.shape) if a.requires_grad \
            else None
        gb = unbroadcast(g * out * xp.log(a.array), e.array.shape) if e.requires_grad else None
        return ga, gb

    return Tensor._make(out, (a, e), backward, "pow")


def rpow(a: Tensor, base: Any) -> Tensor:
    """``base ** a`` for a positive Python scalar base."""
    base = coerce(base, a)
    if isinstance(base, Tensor):
        return pow(base, a)
    out = base ** a.array
    return Tensor._make(out, (a,), lambda g: (g * out * math.log(base),), "rpow")


def exp(a: Tensor) -> Tensor:
    """``e ** a``."""
    (a,) = autocast_args("exp", a)
    out = array_math(backend.get_array_module(a.array)).exp(a.array)
    return Tensor._make(out, (a,), lambda g: (g * out,), "exp")


def log(a: Tensor) -> Tensor:
    """Natural log."""
    (a,) = autocast_args("log", a)
    out = array_math(backend.get_array_module(a.array)).log(a.array)
    return Tensor._make(out, (a,), lambda g: (g / a.array,), "log")


def tanh(a: Tensor) -> Tensor:
    """Hyperbolic tangent; d/dx = 1 - tanh^2."""
    out = backend.get_array_module(a.array).tanh(a.array)
    return Tensor._make(out, (a,), lambda g: (g * (1 - out * out),), "tanh")


def sigmoid(a: Tensor) -> Tensor:
    """``1 / (1 + e^-a)``, computed as ``(1 + tanh(a/2)) / 2`` (no overflow for large |a|)."""
    out = 0.5 * (1 + backend.get_array_module(a.array).tanh(0.5 * a.array))
    return Tensor._make(out, (a,), lambda g: (g * out * (1 - out),), "sigmoid")


def relu(a: Tensor) -> Tensor:
    """``max(a, 0)``; the gradient at 0 is 0 (torch's choice)."""
    out = backend.get_array_module(a.array).maximum(a.array, 0)
    return Tensor._make(out, (a,), lambda g: (g * (a.array > 0),), "relu")


def erfc_abs(a: Any) -> Any:
    """``erfc(a)`` for ``a >= 0`` (Numerical Recipes' Chebyshev fit: relative error < 1.2e-7).

    A RELATIVE bound matters: GELU's negative tail is ``x * erfc(|x|/sqrt 2) / 2``, tiny numbers
    that an absolute-error erf (e.g. Abramowitz & Stegun 7.1.26, 1.5e-7) gets 1e-4 wrong.
    """
    xp = backend.get_array_module(a)
    t = 1.0 / (1.0 + 0.5 * a)
    poly = (-1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (
        -0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (
            -0.82215223 + t * 0.17087277)))))))))
    return t * xp.exp(-a * a + poly)


def erf(x: Any) -> Any:
    """Vectorized error function (via ``erfc_abs``): |error| < 1.2e-7, float32 resolution.

    Computed in float32 or wider and returned in x's dtype. NumPy has no erf and SciPy is not a
    dependency; ``math.erf`` per element would be orders of magnitude slower.
    """
    xp = backend.get_array_module(x)
    z = x.astype(numpy.float32) if x.dtype == numpy.float16 else x
    return (xp.sign(z) * (1.0 - erfc_abs(xp.abs(z)))).astype(x.dtype, copy=False)


def normal_cdf(x: Any) -> Any:
    """``Phi(x) = P(N(0,1) <= x)`` with relative error < 1.2e-7 in both tails."""
    xp = backend.get_array_module(x)
    z = x.astype(numpy.float32) if x.dtype == numpy.float16 else x
    half_tail = 0.5 * erfc_abs(xp.abs(z) * _INV_SQRT_2)  # Phi(-|x|)
    return xp.where(z >= 0, 1.0 - half_tail, half_tail).astype(x.dtype, copy=False)


def gelu(a: Tensor, approximate: str = "none") -> Tensor:
    """GELU: ``x * Phi(x)``, torch's defaults.

    Args:
        a: input.
        approximate: ``"none"`` (default, as torch's nn.GELU): the exact form ``x * Phi(x)``,
            Phi from ``normal_cdf`` (relative error < 1.2e-7, float32 resolution); ``"tanh"``: torch's ``approximate='tanh'``,
            ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``.
    """
    xp = backend.get_array_module(a.array)
    x = a.array
    if approximate == "none":
        cdf = normal_cdf(x)
        out = x * cdf
        return Tensor._make(out, (a,), lambda g: (g * (cdf + x * _INV_SQRT_2PI
                                                       * xp.exp(-0.5 * x * x)),), "gelu")
    if approximate == "tanh":
        inner = _SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)
        t = xp.tanh(inner)
        out = 0.5 * x * (1.0 + t)

        def backward(g: Any) -> tuple:
            dinner = _SQRT_2_OVER_PI * (1.0 + 3 * 0.044715 * x * x)
            return (g * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * dinner),)

        return Tensor._make(out, (a,), backward, "gelu")
    raise ValueError(error("gelu", f"approximate must be 'none' or 'tanh', got {approximate!r}."))


def astype(a: Tensor, dtype: Any) -> Tensor:
    """Cast to ``dtype`` (differentiable between float dtypes; a no-op if already that dtype)."""
    dtype = numpy.dtype(dtype)
    if a.array.dtype == dtype:
        return a
    src = a.array.dtype
    with numpy.errstate(over="ignore"):  # float16 overflows to inf, as on a device
        out = a.array.astype(dtype)

    def backward(g: Any) -> tuple:
        with numpy.errstate(over="ignore"):
            return (g.astype(src),)

    return Tensor._make(out, (a,), backward, "astype")


def to_device(a: Tensor, device: Any) -> Tensor:
    """Copy to ``device`` (differentiable: the gradient goes back to ``a``'s device).

    Returns ``a`` itself when it already lives there, as torch's ``Tensor.to`` does.
    """
    src = backend.device_of(a.array)
    out = backend.move(a.array, device)
    if out is a.array:
        return a

    def backward(g: Any) -> tuple:
        return (backend.move(g, src),)

    return Tensor._make(out, (a,), backward, "to")


def compare(op: str, a: Tensor, b: Any) -> Tensor:
    """Elementwise comparison (``eq``, ``ne``, ``lt``, ``le``, ``gt``, ``ge``): a bool tensor,
    outside the tape (comparisons have no gradient)."""
    other = b.array if isinstance(b, Tensor) else b
    fn = {"eq": "__eq__", "ne": "__ne__", "lt": "__lt__", "le": "__le__", "gt": "__gt__",
          "ge": "__ge__"}[op]
    xp = backend.get_array_module(a.array, other)
    return Tensor(getattr(a.array, fn)(xp.asarray(other)))


def clone(a: Tensor) -> Tensor:
    """A copy of ``a``'s data that stays on the tape (the gradient passes through unchanged)."""
    return Tensor._make(a.array.copy(), (a,), lambda g: (g,), "clone")


def masked_fill(a: Tensor, mask: Any, value: Any) -> Tensor:
    """``value`` where ``mask`` is True, ``a`` elsewhere (the mask broadcasts to ``a``'s shape).

    The gradient passes where the mask is False and is zero where it is True (those elements
    no longer depend on ``a``). A common use: ``scores.masked_fill(~causal, float("-inf"))``.
    """
    m = mask.array if isinstance(mask, Tensor) else mask
    xp = backend.get_array_module(a.array)
    m = xp.asarray(m)
    if m.dtype != numpy.bool_:
        raise TypeError(error("masked_fill", f"mask must be a bool tensor, got dtype {m.dtype}. "
                              "Build it with a comparison (x == 0) or .bool()."))
    if isinstance(value, Tensor):
        if value.array.size != 1:
            raise ValueError(error("masked_fill", f"value must be a number or a one-element "
                                   f"tensor, got shape {value.shape}."))
        value = value.item()
    try:
        out = xp.where(m, xp.asarray(value, dtype=a.array.dtype), a.array)
    except ValueError:
        raise ValueError(broadcast_message("masked_fill", a.shape, tuple(m.shape))) from None
    if out.shape != a.array.shape:
        raise ValueError(error("masked_fill", f"mask of shape {tuple(m.shape)} broadcasts the "
                               f"tensor of shape {a.shape} to {out.shape}. The mask must "
                               "broadcast to the tensor's shape."))
    return Tensor._make(out, (a,), lambda g: (xp.where(m, 0, g).astype(g.dtype, copy=False),),
                        "masked_fill")

