"""A tensor's data made anew on the tape: cast (``astype``), moved (``to_device``), copied
(``clone``), or copied with the masked elements filled (``masked_fill``).

The gradient passes back unchanged (cast back, moved back), except where ``masked_fill``
replaced an element. Each op has its backward beside its forward, as in the spine's
elementwise.py, which re-exports them.
"""

from __future__ import annotations

from typing import Any

import numpy

from minidist import xp as backend
from minidist.tensor.core import Tensor, error
from minidist.tensor.elementwise import broadcast_message


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


__all__ = ["astype", "clone", "masked_fill", "to_device"]
