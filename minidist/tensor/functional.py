"""Fused ops with hand-written backward: softmax, log_softmax, dropout, dropout2d, embedding,
layer_norm. The losses (cross_entropy, nll_loss, mse_loss) are in ``losses``.

Softmax-type ops subtract the row maximum first, so ``exp`` never overflows::

    log_softmax(x) = (x - m) - log(sum(exp(x - m)))          m = max(x, axis)

Under autocast every op here except dropout runs in float32 (float16 inputs are cast up on the
tape first), as torch's autocast does for softmax and layer_norm.
"""

from __future__ import annotations

from typing import Any

import numpy

from minidist import xp as backend
from minidist.tensor import random
from minidist.tensor.autocast_mode import autocast_args
from minidist.tensor.core import Tensor, error
from minidist.tensor import deterministic
from minidist.tensor.deterministic import OFF
from minidist.tensor.reduce import normalize_axes


def _dim(op: str, dim: Any, axis: Any) -> int:
    """torch's ``dim`` or NumPy's ``axis`` keyword (one of them)."""
    if axis is not None and dim not in (None, -1):
        raise TypeError(error(op, f"got both dim={dim!r} and axis={axis!r}; pass one."))
    return axis if axis is not None else (-1 if dim is None else dim)


def softmax(x: Tensor, dim: int | None = -1, *, axis: int | None = None) -> Tensor:
    """``exp(x) / sum(exp(x))`` along ``dim`` (stable; NumPy's ``axis=`` also accepted)."""
    axis = _dim("softmax", dim, axis)
    (x,) = autocast_args("softmax", x)
    xp = backend.get_array_module(x.array)
    (ax,) = normalize_axes("softmax", axis, x.ndim)
    math = xp if deterministic.state is OFF else deterministic.array_math(xp)
    e = math.exp(x.array - x.array.max(axis=ax, keepdims=True))
    out = e / e.sum(axis=ax, keepdims=True)
    return Tensor._make(out, (x,), lambda g: (out * (g - (g * out).sum(axis=ax, keepdims=True)),),
                        "softmax")


def log_softmax(x: Tensor, dim: int | None = -1, *, axis: int | None = None) -> Tensor:
    """``x - logsumexp(x)`` along ``dim`` (stable; NumPy's ``axis=`` also accepted)."""
    axis = _dim("log_softmax", dim, axis)
    (x,) = autocast_args("log_softmax", x)
    xp = backend.get_array_module(x.array)
    (ax,) = normalize_axes("log_softmax", axis, x.ndim)
    shifted = x.array - x.array.max(axis=ax, keepdims=True)
    math = xp if deterministic.state is OFF else deterministic.array_math(xp)
    out = shifted - math.log(math.exp(shifted).sum(axis=ax, keepdims=True))
    return Tensor._make(out, (x,), lambda g: (g - math.exp(out) * g.sum(axis=ax, keepdims=True),),
                        "log_softmax")


def dropout(x: Tensor, p: float = 0.5, training: bool = True,
            generator: numpy.random.Generator | None = None) -> Tensor:
    """Inverted dropout: zero each element with probability ``p``, scale the rest by 1/(1-p).

    The identity when ``training`` is False or ``p == 0``. The mask is drawn from
    ``generator`` (default: the one ``manual_seed`` seeds) on the host, or from CuPy's
    generator for device arrays.
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(error("dropout", f"p must be in [0, 1], got {p}."))
    if not training or p == 0.0:
        return x
    xp = backend.get_array_module(x.array)
    if p == 1.0:
        mask = xp.zeros(x.array.shape, dtype=x.dtype)
    else:
        if xp is numpy:
            u = (generator or random.default_generator()).random(x.array.shape, dtype=numpy.float32)
        else:  # pragma: no cover - needs a GPU
            u = xp.random.random(x.array.shape, dtype=numpy.float32)
        mask = (u >= p).astype(x.dtype) * (1.0 / (1.0 - p))
    return Tensor._make(x.array * mask, (x,), lambda g: (g * mask,), "dropout")


def dropout2d(x: Tensor, p: float = 0.5, training: bool = True) -> Tensor:
    """Channel dropout (torch's ``F.dropout2d``): zero whole channels of (N, C, H, W) (or
    (C, H, W)) with probability ``p``, scale the kept ones by 1/(1-p)."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(error("dropout2d", f"p must be in [0, 1], got {p}."))
    if x.ndim not in (3, 4):
        raise ValueError(error("dropout2d", f"expects (N, C, H, W) or (C, H, W), got shape "
                               f"{x.shape}."))
    if not training or p == 0.0:
        return x
    xp = backend.get_array_module(x.array)
    shape = x.shape[:-2] + (1, 1)
    if xp is numpy:
        u = random.default_generator().random(shape, dtype=numpy.float32)
    else:  # pragma: no cover - needs a GPU
        u = xp.random.random(shape, dtype=numpy.float32)
    mask = (u >= p).astype(x.dtype) * (1.0 / (1.0 - p) if p < 1.0 else 0.0)
    return Tensor._make(x.array * mask, (x,), lambda g: (g * mask,), "dropout2d")


def embedding(input: Any, weight: Tensor, padding_idx: int | None = None) -> Tensor:  # noqa: A002
    """Rows of ``weight`` picked by the int indices ``input`` (torch's ``F.embedding``).

    The gradient of a row used several times is the sum of its uses; the ``padding_idx`` row
    gets none (as torch: the padding vector stays what it was).
    """
    xp = backend.get_array_module(weight.array)
    idx = xp.asarray(input.array if isinstance(input, Tensor) else input)
    num = weight.shape[0]
    if not numpy.issubdtype(idx.dtype, numpy.integer):
        raise TypeError(error("embedding", f"indices must be integers, got dtype {idx.dtype}. "
                              "Convert with .long()."))
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= num):
        raise IndexError(error("embedding", f"index {int(idx.max())} or {int(idx.min())} is "
                               f"outside [0, {num}). Check the vocabulary size."))

    def backward(g: Any) -> tuple:
        gw = xp.zeros(weight.array.shape, dtype=g.dtype)
        xp.add.at(gw, idx, g)
        if padding_idx is not None:
            gw[padding_idx] = 0
        return (gw,)

    return Tensor._make(weight.array[idx], (weight,), backward, "embedding")


def layer_norm(x: Tensor, normalized_shape: tuple[int, ...], weight: Tensor | None = None,
               bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """Normalize over the last ``len(normalized_shape)`` dims, then scale and shift.

    ``y = (x - mean) / sqrt(var + eps) * weight + bias`` with the biased variance, as torch.
    Built from tape ops, so its gradient comes from theirs.
    """
    x, weight, bias = autocast_args("layer_norm", x, weight, bias)
    k = len(normalized_shape)
    if tuple(x.shape[x.ndim - k:]) != tuple(normalized_shape):
        raise ValueError(error("layer_norm", f"input shape {x.shape} does not end with "
                               f"normalized_shape {tuple(normalized_shape)}."))
    axes = tuple(range(x.ndim - k, x.ndim))
    centered = x - x.mean(axis=axes, keepdims=True)
    var = (centered * centered).mean(axis=axes, keepdims=True)
    y = centered * (var + eps) ** -0.5
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y
