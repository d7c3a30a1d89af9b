"""Fused ops with hand-written backward: softmax, log_softmax, cross_entropy, mse_loss,
dropout and layer_norm.

Softmax-type ops subtract the row maximum first, so ``exp`` never overflows::

    log_softmax(x) = (x - m) - log(sum(exp(x - m)))          m = max(x, axis)

``cross_entropy`` fuses log_softmax and the negative log-likelihood into one node whose
backward is ``(softmax(x) - onehot(target)) * g`` (divided by N for ``reduction="mean"``).

Under autocast every op here except dropout runs in float32 (float16 inputs are cast up on the
tape first), as torch's autocast does for softmax, losses and layer_norm.
"""

from __future__ import annotations

from typing import Any

import numpy

from minidist import xp as backend
from minidist.tensor import random
from minidist.tensor.autocast_mode import autocast_args
from minidist.tensor.core import Tensor, as_array, error
from minidist.tensor.reduce import normalize_axes

_REDUCTIONS = ("mean", "sum", "none")


def softmax(x: Tensor, axis: int = -1) -> Tensor:
    """``exp(x) / sum(exp(x))`` along ``axis`` (stable)."""
    (x,) = autocast_args("softmax", x)
    xp = backend.get_array_module(x.data)
    (ax,) = normalize_axes("softmax", axis, x.ndim)
    e = xp.exp(x.data - x.data.max(axis=ax, keepdims=True))
    out = e / e.sum(axis=ax, keepdims=True)
    return Tensor._make(out, (x,), lambda g: (out * (g - (g * out).sum(axis=ax, keepdims=True)),),
                        "softmax")


def log_softmax(x: Tensor, axis: int = -1) -> Tensor:
    """``x - logsumexp(x)`` along ``axis`` (stable)."""
    (x,) = autocast_args("log_softmax", x)
    xp = backend.get_array_module(x.data)
    (ax,) = normalize_axes("log_softmax", axis, x.ndim)
    shifted = x.data - x.data.max(axis=ax, keepdims=True)
    out = shifted - xp.log(xp.exp(shifted).sum(axis=ax, keepdims=True))
    return Tensor._make(out, (x,), lambda g: (g - xp.exp(out) * g.sum(axis=ax, keepdims=True),),
                        "log_softmax")


def _check_reduction(op: str, reduction: str) -> None:
    if reduction not in _REDUCTIONS:
        raise ValueError(error(op, f"reduction must be one of {_REDUCTIONS}, got {reduction!r}."))


def cross_entropy(logits: Tensor, target: Any, reduction: str = "mean") -> Tensor:
    """Softmax cross-entropy of ``logits (N, C)`` against integer class ``target (N,)``.

    Args:
        logits: unnormalized scores, shape (N, C).
        target: class indices in ``[0, C)``, an int array/list/Tensor of shape (N,).
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"`` (per-sample losses, shape (N,)).

    Returns:
        The loss (a scalar unless ``reduction="none"``).
    """
    _check_reduction("cross_entropy", reduction)
    (logits,) = autocast_args("cross_entropy", logits)
    if logits.ndim != 2:
        raise ValueError(error("cross_entropy", f"logits must be (N, C), got shape "
                               f"{logits.shape}. Flatten extra dims into N first."))
    t = as_array(target)
    n, c = logits.shape
    if not numpy.issubdtype(t.dtype, numpy.integer):
        raise ValueError(error("cross_entropy", f"target must hold integer class indices, got "
                               f"dtype {t.dtype}. Convert with .astype(int)."))
    if t.shape != (n,):
        raise ValueError(error("cross_entropy", f"target has shape {tuple(t.shape)} but logits "
                               f"have shape {logits.shape}; target must be ({n},)."))
    if n and (int(t.min()) < 0 or int(t.max()) >= c):
        bad = int(t.min()) if int(t.min()) < 0 else int(t.max())
        raise ValueError(error("cross_entropy", f"target holds class {bad}, outside [0, {c}) for "
                               f"logits with {c} classes. Check the labels or the output size."))
    xp = backend.get_array_module(logits.data)
    t = xp.asarray(t)
    rows = xp.arange(n)
    shifted = logits.data - logits.data.max(axis=1, keepdims=True)
    e = xp.exp(shifted)
    sumexp = e.sum(axis=1, keepdims=True)
    losses = xp.log(sumexp[:, 0]) - shifted[rows, t]
    out = losses.mean() if reduction == "mean" else (losses.sum() if reduction == "sum"
                                                       else losses)

    def backward(g: Any) -> tuple:
        grad = e / sumexp  # softmax, freshly allocated: safe to edit in place
        grad[rows, t] -= 1
        if reduction == "none":
            grad *= g[:, None]
        else:
            grad *= (g / n) if reduction == "mean" else g
        return (grad,)

    return Tensor._make(out, (logits,), backward, "cross_entropy")


def nll_loss(input: Tensor, target: Any, reduction: str = "mean") -> Tensor:  # noqa: A002
    """Negative log-likelihood: ``-input[i, target[i]]`` for log-probabilities ``input (N, C)``.

    ``nll_loss(log_softmax(x), t) == cross_entropy(x, t)`` (the pair torch models often use).
    """
    _check_reduction("nll_loss", reduction)
    if input.ndim != 2:
        raise ValueError(error("nll_loss", f"input must be (N, C) log-probabilities, got shape "
                               f"{input.shape}. Flatten extra dims into N first."))
    n, c = input.shape
    t = backend.to_host(as_array(target))
    if t.shape != (n,) or not numpy.issubdtype(t.dtype, numpy.integer):
        raise ValueError(error("nll_loss", f"target must be ({n},) integer class indices, got "
                               f"shape {t.shape} dtype {t.dtype}."))
    if n and (int(t.min()) < 0 or int(t.max()) >= c):
        raise ValueError(error("nll_loss", f"target holds a class outside [0, {c}). Check the "
                               "labels or the output size."))
    losses = -input[numpy.arange(n), t]
    return losses.mean() if reduction == "mean" else (losses.sum() if reduction == "sum"
                                                      else losses)


def mse_loss(input: Tensor, target: Any, reduction: str = "mean") -> Tensor:  # noqa: A002
    """Mean squared error ``(input - target)^2``, reduced by mean (default), sum or none."""
    _check_reduction("mse_loss", reduction)
    (input,) = autocast_args("mse_loss", input)
    if isinstance(target, Tensor):
        (target,) = autocast_args("mse_loss", target)
    target = target if isinstance(target, Tensor) else Tensor(target, dtype=input.dtype)
    if input.shape != target.shape:
        raise ValueError(error("mse_loss", f"input shape {input.shape} and target shape "
                               f"{target.shape} differ. Reshape the target to the input's "
                               "shape (broadcasting here is almost always a bug)."))
    diff = input - target
    sq = diff * diff
    return sq.mean() if reduction == "mean" else (sq.sum() if reduction == "sum" else sq)


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
    xp = backend.get_array_module(x.data)
    if p == 1.0:
        mask = xp.zeros(x.data.shape, dtype=x.dtype)
    else:
        if xp is numpy:
            u = (generator or random.default_generator()).random(x.data.shape, dtype=numpy.float32)
        else:  # pragma: no cover - needs a GPU
            u = xp.random.random(x.data.shape, dtype=numpy.float32)
        mask = (u >= p).astype(x.dtype) * (1.0 / (1.0 - p))
    return Tensor._make(x.data * mask, (x,), lambda g: (g * mask,), "dropout")


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
