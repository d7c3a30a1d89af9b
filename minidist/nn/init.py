"""Weight initialization in place, with torch's default schemes, drawn from the seeded generator.

    minidist.manual_seed(0)
    layer = nn.Linear(784, 1024)     # weight, bias ~ U(-1/sqrt(784), 1/sqrt(784)), as torch

Draws happen on the host (``numpy.random.default_rng`` behind ``manual_seed``) in float64 and are
cast to the parameter's dtype, so one seed gives the same weights on every rank and device.
"""

from __future__ import annotations

import math

import numpy

from minidist import xp as backend
from minidist.tensor import Tensor, default_generator, manual_seed, no_grad

__all__ = ["manual_seed", "uniform_", "normal_", "constant_", "zeros_", "ones_",
           "kaiming_uniform_", "xavier_uniform_", "fan_in"]


def _fill(t: Tensor, host: numpy.ndarray) -> Tensor:
    xp = backend.get_array_module(t.array)
    with no_grad():
        t.array[...] = xp.asarray(host.astype(t.array.dtype))
    return t


def uniform_(t: Tensor, a: float = 0.0, b: float = 1.0) -> Tensor:
    """Fill ``t`` in place with draws from U(a, b); returns t."""
    return _fill(t, default_generator().uniform(a, b, size=t.shape))


def normal_(t: Tensor, mean: float = 0.0, std: float = 1.0) -> Tensor:
    """Fill ``t`` in place with draws from N(mean, std^2); returns t."""
    return _fill(t, default_generator().normal(mean, std, size=t.shape))


def constant_(t: Tensor, val: float) -> Tensor:
    """Fill ``t`` with ``val`` in place; returns t."""
    t.array[...] = val
    return t


def zeros_(t: Tensor) -> Tensor:
    """Fill ``t`` with zeros in place."""
    t.array[...] = 0
    return t


def ones_(t: Tensor) -> Tensor:
    """Fill ``t`` with ones in place."""
    t.array[...] = 1
    return t


def fan_in(t: Tensor) -> int:
    """Inputs per output unit: ``in`` for a (out, in) weight, ``in*kh*kw`` for a conv weight."""
    if t.ndim < 2:
        return int(t.shape[0]) if t.ndim else 1
    return int(math.prod(t.shape[1:]))


def kaiming_uniform_(t: Tensor, a: float = math.sqrt(5)) -> Tensor:
    """He-uniform init (leaky-relu gain with slope ``a``): bound = gain * sqrt(3 / fan_in).

    torch's default for Linear and Conv2d weights uses ``a = sqrt(5)``, which works out to
    ``bound = 1 / sqrt(fan_in)``.
    """
    gain = math.sqrt(2.0 / (1 + a * a))
    bound = gain * math.sqrt(3.0 / fan_in(t))
    return uniform_(t, -bound, bound)


def xavier_uniform_(t: Tensor, gain: float = 1.0) -> Tensor:
    """Glorot-uniform init: bound = gain * sqrt(6 / (fan_in + fan_out)) (fan_out = dim 0 times
    the receptive field), as torch's ``xavier_uniform_``."""
    receptive = int(math.prod(t.shape[2:])) if t.ndim > 2 else 1
    fan_out = int(t.shape[0]) * receptive
    bound = gain * math.sqrt(6.0 / (fan_in(t) + fan_out))
    return uniform_(t, -bound, bound)
