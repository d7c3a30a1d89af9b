"""Weight initialization in place, with torch's default schemes, drawn from the seeded generator.

    minidist.manual_seed(0)
    layer = nn.Linear(784, 1024)     # weight, bias ~ U(-1/sqrt(784), 1/sqrt(784)), as torch
    nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")  # torchvision's

Every initializer of ``torch.nn.init`` with its signature: ``calculate_gain``, ``uniform_``,
``normal_``, ``trunc_normal_``, ``constant_``, ``ones_``, ``zeros_``, ``eye_``, ``dirac_``,
``xavier_uniform_``, ``xavier_normal_``, ``kaiming_uniform_``, ``kaiming_normal_``,
``orthogonal_``, ``sparse_``. Fans follow torch: for a weight (out, in, *kernel),
``fan_in = in * prod(kernel)`` and ``fan_out = out * prod(kernel)``.

Draws happen on the host (``numpy.random.default_rng`` behind ``manual_seed``) in float64 and are
cast to the parameter's dtype, so one seed gives the same weights on every rank and device.
"""

from __future__ import annotations

import math
from typing import Any

import numpy

from minidist import xp as backend
from minidist.tensor import Tensor, default_generator, manual_seed, no_grad

__all__ = ["manual_seed", "calculate_gain", "uniform_", "normal_", "trunc_normal_", "constant_",
           "zeros_", "ones_", "eye_", "dirac_", "xavier_uniform_", "xavier_normal_",
           "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "sparse_", "fan_in",
           "fans"]

# torch's recommended gains (torch.nn.init.calculate_gain)
LINEAR_GAINS = ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
                "conv_transpose3d", "sigmoid")


def _fill(t: Tensor, host: numpy.ndarray) -> Tensor:
    xp = backend.get_array_module(t.data)
    with no_grad():
        t.data[...] = xp.asarray(host.astype(t.data.dtype))
    return t


def _generator(generator: Any) -> numpy.random.Generator:
    """torch's ``generator=``: a ``numpy.random.Generator`` here, else the seeded default."""
    return generator if generator is not None else default_generator()


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """The gain torch recommends for ``nonlinearity``: 1 for linear/conv/sigmoid, 5/3 for tanh,
    sqrt(2) for relu, sqrt(2 / (1 + slope^2)) for leaky_relu (slope ``param``, default 0.01),
    3/4 for selu."""
    if nonlinearity in LINEAR_GAINS:
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        if param is None:
            slope = 0.01
        elif isinstance(param, (int, float)) and not isinstance(param, bool):
            slope = float(param)
        else:
            raise ValueError(f"calculate_gain: negative_slope {param} is not a valid number.")
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"calculate_gain: unsupported nonlinearity {nonlinearity!r}.")


def uniform_(tensor: Tensor, a: float = 0.0, b: float = 1.0, generator: Any = None) -> Tensor:
    """Fill ``tensor`` in place with draws from U(a, b); returns it."""
    return _fill(tensor, _generator(generator).uniform(a, b, size=tensor.shape))


def normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0, generator: Any = None
            ) -> Tensor:
    """Fill ``tensor`` in place with draws from N(mean, std^2); returns it."""
    return _fill(tensor, _generator(generator).normal(mean, std, size=tensor.shape))


def trunc_normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0,
                  b: float = 2.0, generator: Any = None) -> Tensor:
    """N(mean, std^2) truncated to [a, b] (absolute bounds, as torch), by inverting the CDF."""
    from statistics import NormalDist  # only here: the rest of the module needs no stdlib stats

    unit = NormalDist()
    lo, hi = unit.cdf((a - mean) / std), unit.cdf((b - mean) / std)
    u = _generator(generator).uniform(lo, hi, size=tensor.shape)
    u = numpy.clip(u, numpy.nextafter(0.0, 1.0), numpy.nextafter(1.0, 0.0))
    z = numpy.vectorize(unit.inv_cdf, otypes=[numpy.float64])(u) if u.size else u
    return _fill(tensor, numpy.clip(mean + std * z, a, b))


def constant_(tensor: Tensor, val: float) -> Tensor:
    """Fill ``tensor`` with ``val`` in place; returns it."""
    tensor.data[...] = val
    return tensor


def zeros_(tensor: Tensor) -> Tensor:
    """Fill ``tensor`` with zeros in place."""
    tensor.data[...] = 0
    return tensor


def ones_(tensor: Tensor) -> Tensor:
    """Fill ``tensor`` with ones in place."""
    tensor.data[...] = 1
    return tensor


def eye_(tensor: Tensor) -> Tensor:
    """The identity matrix into a 2-D ``tensor`` (ones on the diagonal, as torch)."""
    if tensor.ndim != 2:
        raise ValueError(f"eye_: only 2-D tensors are supported, got shape {tensor.shape}.")
    rows, cols = tensor.shape
    return _fill(tensor, numpy.eye(rows, cols))


def dirac_(tensor: Tensor, groups: int = 1) -> Tensor:
    """A 3/4/5-D conv weight that passes its input through (a centred 1 per kept channel)."""
    if tensor.ndim not in (3, 4, 5):
        raise ValueError(f"dirac_: only 3, 4 or 5-D tensors are supported, got {tensor.shape}.")
    out_per_group = tensor.shape[0] // groups
    host = numpy.zeros(tensor.shape)
    centre = tuple(k // 2 for k in tensor.shape[2:])
    for g in range(groups):
        for d in range(min(out_per_group, tensor.shape[1])):
            host[(g * out_per_group + d, d) + centre] = 1
    return _fill(tensor, host)


def fans(t: Tensor) -> tuple[int, int]:
    """``(fan_in, fan_out)`` of a weight (out, in, *kernel), as torch computes them."""
    if t.ndim < 2:
        raise ValueError(f"Fan in and fan out can not be computed for a tensor with fewer than "
                         f"2 dimensions (shape {t.shape}).")
    receptive = int(math.prod(t.shape[2:])) if t.ndim > 2 else 1
    return int(t.shape[1]) * receptive, int(t.shape[0]) * receptive


def fan_in(t: Tensor) -> int:
    """Inputs per output unit: ``in`` for a (out, in) weight, ``in*kh*kw`` for a conv weight."""
    if t.ndim < 2:
        return int(t.shape[0]) if t.ndim else 1
    return fans(t)[0]


def _kaiming_std(t: Tensor, a: float, mode: str, nonlinearity: str) -> float:
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"kaiming init: mode {mode!r} not supported, use 'fan_in' or 'fan_out'.")
    fan = fans(t)[0 if mode == "fan_in" else 1]
    if fan == 0:
        return 0.0
    return calculate_gain(nonlinearity, a) / math.sqrt(fan)


def kaiming_uniform_(tensor: Tensor, a: float = 0.0, mode: str = "fan_in",
                     nonlinearity: str = "leaky_relu", generator: Any = None) -> Tensor:
    """He-uniform init: U(-bound, bound), bound = gain * sqrt(3 / fan) (torch's signature).

    ``a`` is the leaky-relu slope for the gain. torch's default for Linear and Conv2d weights
    is ``kaiming_uniform_(w, a=math.sqrt(5))``, which works out to ``bound = 1 / sqrt(fan_in)``.
    """
    bound = math.sqrt(3.0) * _kaiming_std(tensor, a, mode, nonlinearity)
    return uniform_(tensor, -bound, bound, generator)


def kaiming_normal_(tensor: Tensor, a: float = 0.0, mode: str = "fan_in",
                    nonlinearity: str = "leaky_relu", generator: Any = None) -> Tensor:
    """He-normal init: N(0, std^2), std = gain / sqrt(fan) (torchvision's ResNet uses
    ``mode="fan_out", nonlinearity="relu"``)."""
    return normal_(tensor, 0.0, _kaiming_std(tensor, a, mode, nonlinearity), generator)


def xavier_uniform_(tensor: Tensor, gain: float = 1.0, generator: Any = None) -> Tensor:
    """Glorot-uniform init: bound = gain * sqrt(6 / (fan_in + fan_out)), as torch."""
    f_in, f_out = fans(tensor)
    bound = gain * math.sqrt(6.0 / (f_in + f_out))
    return uniform_(tensor, -bound, bound, generator)


def xavier_normal_(tensor: Tensor, gain: float = 1.0, generator: Any = None) -> Tensor:
    """Glorot-normal init: std = gain * sqrt(2 / (fan_in + fan_out)), as torch."""
    f_in, f_out = fans(tensor)
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / (f_in + f_out)), generator)


def orthogonal_(tensor: Tensor, gain: float = 1.0, generator: Any = None) -> Tensor:
    """A (semi-)orthogonal matrix (the trailing dims flattened), scaled by ``gain``: QR of a
    normal draw with the signs fixed by R's diagonal, as torch."""
    if tensor.ndim < 2:
        raise ValueError("orthogonal_: only tensors with 2 or more dimensions are supported.")
    rows = int(tensor.shape[0])
    cols = int(math.prod(tensor.shape[1:]))
    flat = _generator(generator).normal(size=(rows, cols))
    if rows < cols:
        flat = flat.T
    q, r = numpy.linalg.qr(flat)
    q *= numpy.sign(numpy.diag(r))
    if rows < cols:
        q = q.T
    return _fill(tensor, gain * q.reshape(tensor.shape))


def sparse_(tensor: Tensor, sparsity: float, std: float = 0.01, generator: Any = None
            ) -> Tensor:
    """A 2-D ``tensor`` ~ N(0, std^2) with ``ceil(sparsity * rows)`` zeros in each column."""
    if tensor.ndim != 2:
        raise ValueError("sparse_: only 2-D tensors are supported.")
    rows, cols = tensor.shape
    gen = _generator(generator)
    host = gen.normal(0.0, std, size=(rows, cols))
    for c in range(cols):
        host[gen.permutation(rows)[:math.ceil(sparsity * rows)], c] = 0
    return _fill(tensor, host)
