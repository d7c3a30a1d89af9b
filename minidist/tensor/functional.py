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
from minidist.envvars import env
from minidist.tensor import random, xent_cupy
from minidist.tensor.autocast_mode import autocast_args
from minidist.tensor.core import Tensor, as_array, error
from minidist.tensor.reduce import normalize_axes

_REDUCTIONS = ("mean", "sum", "none")


def _dim(op: str, dim: Any, axis: Any) -> int:
    """torch's ``dim`` or NumPy's ``axis`` keyword (one of them)."""
    if axis is not None and dim not in (None, -1):
        raise TypeError(error(op, f"got both dim={dim!r} and axis={axis!r}; pass one."))
    return axis if axis is not None else (-1 if dim is None else dim)


def softmax(x: Tensor, dim: int | None = -1, *, axis: int | None = None) -> Tensor:
    """``exp(x) / sum(exp(x))`` along ``dim`` (stable; NumPy's ``axis=`` also accepted)."""
    axis = _dim("softmax", dim, axis)
    (x,) = autocast_args("softmax", x)
    xp = backend.get_array_module(x.data)
    (ax,) = normalize_axes("softmax", axis, x.ndim)
    e = xp.exp(x.data - x.data.max(axis=ax, keepdims=True))
    out = e / e.sum(axis=ax, keepdims=True)
    return Tensor._make(out, (x,), lambda g: (out * (g - (g * out).sum(axis=ax, keepdims=True)),),
                        "softmax")


def log_softmax(x: Tensor, dim: int | None = -1, *, axis: int | None = None) -> Tensor:
    """``x - logsumexp(x)`` along ``dim`` (stable; NumPy's ``axis=`` also accepted)."""
    axis = _dim("log_softmax", dim, axis)
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


def cross_entropy(input: Tensor, target: Any, weight: Any = None,  # noqa: A002 - torch's name
                  size_average: None = None, ignore_index: int = -100, reduce: None = None,
                  reduction: str = "mean", label_smoothing: float = 0.0) -> Tensor:
    """Softmax cross-entropy of ``input (N, C)`` against class indices or class probabilities.

    torch's ``F.cross_entropy`` (arguments in its order). With class indices ``target (N,)``::

        loss_i = -w[t_i] * ((1 - eps) * logp[i, t_i] + eps/C * sum_c w_c/w[t_i] * logp[i, c])
        mean:  sum_i loss_i / sum_i w[t_i]          (rows with t_i == ignore_index left out)

    where ``logp = log_softmax(input)``, ``eps = label_smoothing`` and ``w = weight`` (ones by
    default). With probabilities ``target (N, C)`` (float, rows summing to 1):
    ``loss_i = -sum_c w_c * q_ic * logp[i, c]`` with ``q = (1 - eps) * target + eps / C``, and
    ``"mean"`` divides by N.

    Args:
        input: unnormalized scores, shape (N, C).
        target: class indices in ``[0, C)`` (an int array/list/Tensor of shape (N,)), or class
            probabilities of shape (N, C) (float).
        weight: per-class weights (C,), or None.
        size_average, reduce: torch's deprecated arguments; must be None.
        ignore_index: a class index whose rows add nothing (not even to the mean's count).
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"`` (per-sample losses, (N,)).
        label_smoothing: in [0, 1]: mix the target with the uniform distribution.

    Returns:
        The loss (a scalar unless ``reduction="none"``).
    """
    if isinstance(weight, str):
        raise TypeError(error("cross_entropy", f"the third argument is weight (torch's order), "
                              f"got {weight!r}. Pass reduction={weight!r} by keyword."))
    if size_average is not None or reduce is not None:
        raise ValueError(error("cross_entropy", "size_average and reduce are deprecated in "
                               "torch and not supported; use reduction=."))
    _check_reduction("cross_entropy", reduction)
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(error("cross_entropy", f"label_smoothing must be in [0, 1], got "
                               f"{label_smoothing}."))
    (logits,) = autocast_args("cross_entropy", input)
    if logits.ndim != 2:
        raise ValueError(error("cross_entropy", f"input must be (N, C), got shape "
                               f"{logits.shape}. Flatten extra dims into N first "
                               "(logits.view(-1, logits.size(-1)))."))
    n, c = logits.shape
    t = as_array(target)
    if numpy.issubdtype(t.dtype, numpy.floating):
        if tuple(t.shape) != (n, c):
            raise ValueError(error("cross_entropy", f"a float target holds class probabilities "
                                   f"and must have the input's shape ({n}, {c}), got "
                                   f"{tuple(t.shape)}. For class indices use an int target."))
        return _cross_entropy_probs(logits, target, weight, reduction, label_smoothing)
    if not numpy.issubdtype(t.dtype, numpy.integer):
        raise ValueError(error("cross_entropy", f"target must hold integer class indices, got "
                               f"dtype {t.dtype}. Convert with .astype(int)."))
    if t.shape != (n,):
        raise ValueError(error("cross_entropy", f"target has shape {tuple(t.shape)} but input "
                               f"has shape {logits.shape}; target must be ({n},)."))
    xp = backend.get_array_module(logits.data)
    if xp is not numpy:  # on a GPU: no host read unless asked for (MINIDIST_DEBUG=1)
        t = xp.asarray(backend.move(t, logits.device))
        if env("MINIDIST_DEBUG"):
            _check_labels(backend.to_host(t, op="cross_entropy (label check, MINIDIST_DEBUG)"),
                          c, ignore_index)
        if weight is not None or label_smoothing:
            return _cross_entropy_general(logits, t, t != ignore_index, weight, ignore_index,
                                          reduction, label_smoothing)
        if xent_cupy.available():
            try:
                return _cross_entropy_fused(logits, t, ignore_index, reduction)
            except Exception as exc:  # compiling the kernels failed: the formulas, once warned
                xent_cupy.give_up(exc)
        return cross_entropy_on_device(logits, t, ignore_index, reduction)
    host = numpy.asarray(t)
    kept = _check_labels(host, c, ignore_index)
    if weight is not None or label_smoothing or not kept.all():
        return _cross_entropy_general(logits, host, kept, weight, ignore_index, reduction,
                                      label_smoothing)
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


def _check_labels(host: numpy.ndarray, c: int, ignore_index: int) -> numpy.ndarray:
    """Raise unless every label is in [0, c) or ``ignore_index``; return the kept rows' mask."""
    kept = host != ignore_index
    if kept.any() and (int(host[kept].min()) < 0 or int(host[kept].max()) >= c):
        bad = int(host[kept].min()) if int(host[kept].min()) < 0 else int(host[kept].max())
        raise ValueError(error("cross_entropy", f"target holds class {bad}, outside [0, {c}) for "
                               f"input with {c} classes (and not ignore_index={ignore_index}). "
                               "Check the labels or the output size."))
    return kept


def cross_entropy_on_device(logits: Tensor, t: Any, ignore_index: int = -100,
                            reduction: str = "mean") -> Tensor:
    """Class-index cross-entropy that never reads a device value on the host: what
    ``cross_entropy`` runs on a GPU (any array module: the tests run it on NumPy).

    Nothing is decided on the host: rows with ``t == ignore_index`` are masked (they add 0,
    and the mean divides by the kept rows' count, a device scalar), and a label outside
    ``[0, C)`` makes that row's loss NaN instead of raising (checking it would need the labels
    on the host; ``MINIDIST_DEBUG=1`` does that check and raises, as the CPU always does).

        loss_i = (log(sum_c exp(x_ic - m_i)) - (x_i,t_i - m_i)) * kept_i     m_i = max_c x_ic
        grad_ic = (softmax(x)_ic - [c == t_i]) * kept_i * g  (/ count for "mean")
    """
    xp = backend.get_array_module(logits.data)
    n, c = logits.shape
    kept = t != ignore_index
    bad = kept & ((t < 0) | (t >= c))
    safe = xp.where(kept & ~bad, t, 0)
    rows = xp.arange(n)
    shifted = logits.data - logits.data.max(axis=1, keepdims=True)
    e = xp.exp(shifted)
    sumexp = e.sum(axis=1, keepdims=True)
    weight = kept.astype(logits.dtype)
    weight = xp.where(bad, xp.asarray(numpy.nan, logits.dtype), weight)
    losses = (xp.log(sumexp[:, 0]) - shifted[rows, safe]) * weight
    count = weight.sum()  # kept rows (NaN when a label is bad: the mean is NaN too)
    out = losses.sum() / count if reduction == "mean" else (losses.sum() if reduction == "sum"
                                                             else losses)

    def backward(g: Any) -> tuple:
        grad = e / sumexp
        grad[rows, safe] -= 1
        scale = weight * g if reduction == "none" else weight * (g / count if reduction == "mean"
                                                                 else g)
        grad *= scale[:, None]
        return (grad,)

    return Tensor._make(out, (logits,), backward, "cross_entropy")


def _cross_entropy_fused(logits: Tensor, t: Any, ignore_index: int,
                         reduction: str) -> Tensor:  # pragma: no cover - needs a GPU
    """``cross_entropy_on_device`` in two fused CuPy kernels (``xent_cupy``): one launch
    forward (+ the reduction), one backward; nothing read on the host."""
    xp = backend.get_array_module(logits.data)
    n, c = logits.shape
    x = xp.ascontiguousarray(logits.data)
    t = t.astype(xp.int64, copy=False)
    losses, m, s = xent_cupy.forward_kernel()(x, t, c, ignore_index, numpy.nan)
    count = (t != ignore_index).sum(dtype=x.dtype) if reduction == "mean" else None
    out = losses.sum() / count if reduction == "mean" else (losses.sum() if reduction == "sum"
                                                             else losses)

    def backward(g: Any) -> tuple:
        scale = g if reduction == "none" else (g / count if reduction == "mean" else g)
        scale = xp.ascontiguousarray(scale.astype(x.dtype, copy=False).reshape(-1))
        grad = xent_cupy.backward_kernel()(x, m, s, t, scale, reduction == "none", c,
                                           ignore_index, numpy.nan)
        return (grad,)

    return Tensor._make(out, (logits,), backward, "cross_entropy")


def _class_weights(logits: Tensor, weight: Any) -> Any:
    """The (C,) weight array in the logits' dtype and device (ones when None)."""
    xp = backend.get_array_module(logits.data)
    c = logits.shape[1]
    if weight is None:
        return xp.ones(c, dtype=logits.dtype)
    w = xp.asarray(backend.move(as_array(weight), logits.device)).astype(logits.dtype)
    if w.shape != (c,):
        raise ValueError(error("cross_entropy", f"weight must have shape ({c},), one per class, "
                               f"got {tuple(w.shape)}."))
    return w


def _cross_entropy_general(logits: Tensor, t: Any, kept: Any, weight: Any,
                           ignore_index: int, reduction: str, eps: float) -> Tensor:
    """Class-index cross-entropy with class weights, ignore_index and label smoothing, built
    from tape ops (torch's formula, its mean normalized by the kept rows' target weights).
    ``t`` and ``kept`` are on the logits' device; on a GPU the labels are not checked (a bad
    one makes its row's loss NaN, as in ``cross_entropy_on_device``)."""
    xp = backend.get_array_module(logits.data)
    n, c = logits.shape
    w = _class_weights(logits, weight)
    logp = log_softmax(logits, 1)
    bad = kept & ((t < 0) | (t >= c))
    safe = xp.where(kept & ~bad, t, 0)
    keep = xp.where(bad, xp.asarray(numpy.nan, logits.dtype), kept.astype(logits.dtype))
    wt = w[safe] * keep                                   # (N,) target weights, 0 if ignored
    nll = -(logp[xp.arange(n), safe] * Tensor(wt))        # (N,)
    smooth = -((logp * Tensor(w)).sum(axis=1) * Tensor(keep))
    if reduction == "none":
        return nll * (1.0 - eps) + smooth * (eps / c)
    total = nll.sum() * (1.0 - eps) + smooth.sum() * (eps / c)
    if reduction == "sum":
        return total
    return total / Tensor(wt.sum())  # no kept row: 0/0 = NaN, as torch


def _cross_entropy_probs(logits: Tensor, target: Any, weight: Any, reduction: str,
                         eps: float) -> Tensor:
    """Cross-entropy against class probabilities (N, C): ``-sum_c w_c q_ic logp_ic``."""
    n, c = logits.shape
    q = target if isinstance(target, Tensor) else Tensor(as_array(target, logits.dtype))
    if eps:
        q = q * (1.0 - eps) + eps / c
    per_class = log_softmax(logits, 1) * q
    if weight is not None:
        per_class = per_class * Tensor(_class_weights(logits, weight))
    losses = -per_class.sum(axis=1)
    if reduction == "none":
        return losses
    return losses.sum() if reduction == "sum" else losses.sum() / n


def nll_loss(input: Tensor, target: Any, reduction: str = "mean") -> Tensor:  # noqa: A002
    """Negative log-likelihood: ``-input[i, target[i]]`` for log-probabilities ``input (N, C)``.

    ``nll_loss(log_softmax(x), t) == cross_entropy(x, t)`` (the pair torch models often use).
    """
    _check_reduction("nll_loss", reduction)
    if input.ndim != 2:
        raise ValueError(error("nll_loss", f"input must be (N, C) log-probabilities, got shape "
                               f"{input.shape}. Flatten extra dims into N first."))
    n, c = input.shape
    t = as_array(target)
    if tuple(t.shape) != (n,) or not numpy.issubdtype(t.dtype, numpy.integer):
        raise ValueError(error("nll_loss", f"target must be ({n},) integer class indices, got "
                               f"shape {tuple(t.shape)} dtype {t.dtype}."))
    xp = backend.get_array_module(input.data)
    if xp is numpy or env("MINIDIST_DEBUG"):  # on a GPU the check is a host read: debug only
        host = backend.to_host(t, op="nll_loss (label check, MINIDIST_DEBUG)") \
            if backend.is_device_array(t) else numpy.asarray(t)
        if n and (int(host.min()) < 0 or int(host.max()) >= c):
            raise ValueError(error("nll_loss", f"target holds a class outside [0, {c}). Check "
                                   "the labels or the output size."))
    idx = numpy.asarray(t) if xp is numpy else xp.asarray(backend.move(t, input.device))
    losses = -input[xp.arange(n), idx]
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
    xp = backend.get_array_module(x.data)
    shape = x.shape[:-2] + (1, 1)
    if xp is numpy:
        u = random.default_generator().random(shape, dtype=numpy.float32)
    else:  # pragma: no cover - needs a GPU
        u = xp.random.random(shape, dtype=numpy.float32)
    mask = (u >= p).astype(x.dtype) * (1.0 / (1.0 - p) if p < 1.0 else 0.0)
    return Tensor._make(x.data * mask, (x,), lambda g: (g * mask,), "dropout2d")


def embedding(input: Any, weight: Tensor, padding_idx: int | None = None) -> Tensor:  # noqa: A002
    """Rows of ``weight`` picked by the int indices ``input`` (torch's ``F.embedding``).

    The gradient of a row used several times is the sum of its uses; the ``padding_idx`` row
    gets none (as torch: the padding vector stays what it was).
    """
    xp = backend.get_array_module(weight.data)
    idx = xp.asarray(input.data if isinstance(input, Tensor) else input)
    num = weight.shape[0]
    if not numpy.issubdtype(idx.dtype, numpy.integer):
        raise TypeError(error("embedding", f"indices must be integers, got dtype {idx.dtype}. "
                              "Convert with .long()."))
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= num):
        raise IndexError(error("embedding", f"index {int(idx.max())} or {int(idx.min())} is "
                               f"outside [0, {num}). Check the vocabulary size."))

    def backward(g: Any) -> tuple:
        gw = xp.zeros(weight.data.shape, dtype=g.dtype)
        xp.add.at(gw, idx, g)
        if padding_idx is not None:
            gw[padding_idx] = 0
        return (gw,)

    return Tensor._make(weight.data[idx], (weight,), backward, "embedding")


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
