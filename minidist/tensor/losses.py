"""Losses with hand-written backward: cross_entropy, nll_loss, mse_loss.

    >>> from minidist.tensor import Tensor, cross_entropy
    >>> logits = Tensor([[2.0, 0.0], [0.0, 2.0]], requires_grad=True)
    >>> loss = cross_entropy(logits, [0, 1])
    >>> loss.backward()
    >>> round(loss.item(), 4), logits.grad.shape
    (0.1269, (2, 2))

``cross_entropy`` fuses log_softmax and the negative log-likelihood into one node whose
backward is ``(softmax(x) - onehot(target)) * g`` (divided by N for ``reduction="mean"``);
the row maximum is subtracted first, so ``exp`` never overflows (see ``functional``). Its
variants, from the plain CPU path down:

    cross_entropy            class indices, no weights: the fused node (the default path)
    cross_entropy_on_device  on a GPU: nothing read on the host, bad labels give NaN rows
    _cross_entropy_fused     the same in two CuPy kernels (``xent_cupy``), when they compile
    _cross_entropy_general   class weights, ignore_index, label smoothing: from tape ops
    _cross_entropy_probs     class probabilities as the target: from tape ops

Under autocast every loss here runs in float32 (float16 inputs are cast up on the tape
first), as torch's autocast does.
"""

from __future__ import annotations

from typing import Any

import numpy

from minidist import xp as backend
from minidist.envvars import env
from minidist.tensor import xent_cupy
from minidist.tensor.autocast_mode import autocast_args
from minidist.tensor.core import Tensor, as_array, error
from minidist.tensor import deterministic
from minidist.tensor.deterministic import OFF
from minidist.tensor.functional import log_softmax

_REDUCTIONS = ("mean", "sum", "none")


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
    xp = backend.get_array_module(logits.array)
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
    shifted = logits.array - logits.array.max(axis=1, keepdims=True)
    math = xp if deterministic.state is OFF else deterministic.array_math(xp)
    e = math.exp(shifted)
    sumexp = e.sum(axis=1, keepdims=True)
    losses = math.log(sumexp[:, 0]) - shifted[rows, t]
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
    xp = backend.get_array_module(logits.array)
    n, c = logits.shape
    kept = t != ignore_index
    bad = kept & ((t < 0) | (t >= c))
    safe = xp.where(kept & ~bad, t, 0)
    rows = xp.arange(n)
    shifted = logits.array - logits.array.max(axis=1, keepdims=True)
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
    xp = backend.get_array_module(logits.array)
    n, c = logits.shape
    x = xp.ascontiguousarray(logits.array)
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
    xp = backend.get_array_module(logits.array)
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
    xp = backend.get_array_module(logits.array)
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
    xp = backend.get_array_module(input.array)
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
