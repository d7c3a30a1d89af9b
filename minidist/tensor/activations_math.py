"""torch's activations and the math under them: tanh, sigmoid, gelu (with the erf and the
normal CDF it needs) and ``base ** x`` (the exponential of another base).

The main job's elementwise ops (+ - * / **, exp, log, relu) are in the spine's elementwise.py;
each op here has its backward beside its forward, as there, and elementwise re-exports them.
"""

from __future__ import annotations

import math
from typing import Any

import numpy

from minidist import xp as backend
from minidist.tensor.core import Tensor, error
from minidist.tensor.elementwise import coerce, pow

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def rpow(a: Tensor, base: Any) -> Tensor:
    """``base ** a`` for a positive Python scalar base."""
    base = coerce(base, a)
    if isinstance(base, Tensor):
        return pow(base, a)
    out = base ** a.array
    return Tensor._make(out, (a,), lambda g: (g * out * math.log(base),), "rpow")


def tanh(a: Tensor) -> Tensor:
    """Hyperbolic tangent; d/dx = 1 - tanh^2."""
    out = backend.get_array_module(a.array).tanh(a.array)
    return Tensor._make(out, (a,), lambda g: (g * (1 - out * out),), "tanh")


def sigmoid(a: Tensor) -> Tensor:
    """``1 / (1 + e^-a)``, computed as ``(1 + tanh(a/2)) / 2`` (no overflow for large |a|)."""
    out = 0.5 * (1 + backend.get_array_module(a.array).tanh(0.5 * a.array))
    return Tensor._make(out, (a,), lambda g: (g * out * (1 - out),), "sigmoid")


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
            Phi from ``normal_cdf`` (relative error < 1.2e-7, float32 resolution); ``"tanh"``:
            torch's ``approximate='tanh'``,
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


__all__ = ["erf", "erfc_abs", "gelu", "normal_cdf", "rpow", "sigmoid", "tanh"]
