"""Cross-entropy's other paths (not in the spine's reading path).

losses.py holds the textbook path: ``cross_entropy`` with class indices on the CPU, one fused
node. Everything else it dispatches to lives here:

    cross_entropy_on_device  on a GPU: nothing read on the host, bad labels give NaN rows
    _cross_entropy_fused     the same in two CuPy kernels (``xent_cupy``), when they compile
    cross_entropy_general    class weights, ignore_index, label smoothing: from tape ops
    _cross_entropy_probs     class probabilities as the target: from tape ops

Under autocast they run in float32 (losses.py casts float16 inputs up on the tape first), as
torch's autocast does. The other losses (nll_loss, mse_loss) are in nll_mse_losses.py.
"""

from __future__ import annotations

from typing import Any

import numpy

from minidist import xp as backend
from minidist.envvars import env
from minidist.tensor import xent_cupy
from minidist.tensor.core import Tensor, as_array, error
from minidist.tensor.functional import log_softmax
from minidist.tensor.nll_mse_losses import check_reduction


def check_cross_entropy_args(weight: Any, size_average: Any, reduce: Any, reduction: str,
                             label_smoothing: float) -> None:
    """Refuse what torch's ``F.cross_entropy`` signature allows but means otherwise here."""
    if isinstance(weight, str):
        raise TypeError(error("cross_entropy", f"the third argument is weight (torch's order), "
                              f"got {weight!r}. Pass reduction={weight!r} by keyword."))
    if size_average is not None or reduce is not None:
        raise ValueError(error("cross_entropy", "size_average and reduce are deprecated in "
                               "torch and not supported; use reduction=."))
    check_reduction("cross_entropy", reduction)
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(error("cross_entropy", f"label_smoothing must be in [0, 1], got "
                               f"{label_smoothing}."))


def check_labels(host: numpy.ndarray, c: int, ignore_index: int) -> numpy.ndarray:
    """Raise unless every label is in [0, c) or ``ignore_index``; return the kept rows' mask."""
    kept = host != ignore_index
    if kept.any() and (int(host[kept].min()) < 0 or int(host[kept].max()) >= c):
        bad = int(host[kept].min()) if int(host[kept].min()) < 0 else int(host[kept].max())
        raise ValueError(error("cross_entropy", f"target holds class {bad}, outside [0, {c}) for "
                               f"input with {c} classes (and not ignore_index={ignore_index}). "
                               "Check the labels or the output size."))
    return kept


def cross_entropy_probs(logits: Tensor, target: Any, weight: Any, reduction: str,
                        eps: float) -> Tensor:
    """Cross-entropy against class probabilities ``target (N, C)`` (float, rows summing to 1):
    ``loss_i = -sum_c w_c * q_ic * logp[i, c]`` with ``q = (1 - eps) * target + eps / C``;
    ``"mean"`` divides by N."""
    n, c = logits.shape
    shape = tuple(as_array(target).shape)
    if shape != (n, c):
        raise ValueError(error("cross_entropy", f"a float target holds class probabilities "
                               f"and must have the input's shape ({n}, {c}), got "
                               f"{shape}. For class indices use an int target."))
    return _cross_entropy_probs(logits, target, weight, reduction, eps)


def cross_entropy_gpu(logits: Tensor, t: Any, weight: Any, ignore_index: int, reduction: str,
                      label_smoothing: float) -> Tensor:
    """Class-index cross-entropy on a GPU: no host read unless asked for (MINIDIST_DEBUG=1);
    the fused CuPy kernels when they compile, else ``cross_entropy_on_device``."""
    xp = backend.get_array_module(logits.array)
    t = xp.asarray(backend.move(t, logits.device))
    if env("MINIDIST_DEBUG"):
        check_labels(backend.to_host(t, op="cross_entropy (label check, MINIDIST_DEBUG)"),
                     logits.shape[1], ignore_index)
    if weight is not None or label_smoothing:
        return cross_entropy_general(logits, t, t != ignore_index, weight, ignore_index,
                                     reduction, label_smoothing)
    if xent_cupy.available():
        try:
            return _cross_entropy_fused(logits, t, ignore_index, reduction)
        except Exception as exc:  # compiling the kernels failed: the formulas, once warned
            xent_cupy.give_up(exc)
    return cross_entropy_on_device(logits, t, ignore_index, reduction)



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


def cross_entropy_general(logits: Tensor, t: Any, kept: Any, weight: Any,
                           ignore_index: int, reduction: str, eps: float) -> Tensor:
    """Class-index cross-entropy with class weights, ignore_index and label smoothing, built
    from tape ops (torch's formula, its mean normalized by the kept rows' target weights)::

        loss_i = -w[t_i] * ((1 - eps) * logp[i, t_i] + eps/C * sum_c w_c/w[t_i] * logp[i, c])
        mean:  sum_i loss_i / sum_i w[t_i]          (rows with t_i == ignore_index left out)

    where ``logp = log_softmax(input)``, ``eps = label_smoothing``, ``w = weight`` (ones by
    default).
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


__all__ = ["check_cross_entropy_args", "check_labels", "cross_entropy_general",
           "cross_entropy_gpu", "cross_entropy_on_device", "cross_entropy_probs"]
