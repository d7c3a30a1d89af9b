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

from typing import Any


from minidist import xp as backend
from minidist.tensor.autocast_mode import autocast_args
from minidist.tensor.core import Tensor, error, is_floating
from minidist.tensor.deterministic import array_math

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


def relu(a: Tensor) -> Tensor:
    """``max(a, 0)``; the gradient at 0 is 0 (torch's choice)."""
    out = backend.get_array_module(a.array).maximum(a.array, 0)
    return Tensor._make(out, (a,), lambda g: (g * (a.array > 0),), "relu")


def compare(op: str, a: Tensor, b: Any) -> Tensor:
    """Elementwise comparison (``eq``, ``ne``, ``lt``, ``le``, ``gt``, ``ge``): a bool tensor,
    outside the tape (comparisons have no gradient)."""
    other = b.array if isinstance(b, Tensor) else b
    fn = {"eq": "__eq__", "ne": "__ne__", "lt": "__lt__", "le": "__le__", "gt": "__gt__",
          "ge": "__ge__"}[op]
    xp = backend.get_array_module(a.array, other)
    return Tensor(getattr(a.array, fn)(xp.asarray(other)))


# torch's other elementwise ops (tanh, sigmoid, gelu, casts, masked_fill...), kept importable
# from here: activations_math.py and casts_copies.py
from minidist.tensor.activations_math import (erf, erfc_abs, gelu, normal_cdf,  # noqa: E402,F401
                                              rpow, sigmoid, tanh)
from minidist.tensor.casts_copies import astype, clone, masked_fill, to_device  # noqa: E402,F401
