"""The loss of the main job: cross_entropy, fused, with a hand-written backward.

    >>> from minidist.tensor import Tensor, cross_entropy
    >>> logits = Tensor([[2.0, 0.0], [0.0, 2.0]], requires_grad=True)
    >>> loss = cross_entropy(logits, [0, 1])
    >>> loss.backward()
    >>> round(loss.item(), 4), logits.grad.shape
    (0.1269, (2, 2))

``cross_entropy`` fuses log_softmax and the negative log-likelihood into one node whose
backward is ``(softmax(x) - onehot(target)) * g`` (divided by N for ``reduction="mean"``);
the row maximum is subtracted first, so ``exp`` never overflows (see ``functional``). That
node is the CPU path for class indices without class weights; the other paths (on a GPU,
class weights, ignore_index, label smoothing, class probabilities) and the other losses
(nll_loss, mse_loss) are in cross_entropy_paths.py and nll_mse_losses.py. Under autocast
the loss runs in float32.
"""

from __future__ import annotations

from typing import Any

import numpy

from minidist import xp as backend
from minidist.tensor.autocast_mode import autocast_args
from minidist.tensor.core import Tensor, as_array, error
from minidist.tensor import deterministic
from minidist.tensor.deterministic import OFF
from minidist.tensor.cross_entropy_paths import (check_cross_entropy_args, check_labels,
                                                 cross_entropy_general, cross_entropy_gpu,
                                                 cross_entropy_probs)
from minidist.tensor.cross_entropy_paths import cross_entropy_on_device  # noqa: F401
from minidist.tensor.nll_mse_losses import mse_loss, nll_loss  # noqa: F401


def cross_entropy(input: Tensor, target: Any, weight: Any = None,  # noqa: A002 - torch's name
                  size_average: None = None, ignore_index: int = -100, reduce: None = None,
                  reduction: str = "mean", label_smoothing: float = 0.0) -> Tensor:
    """Softmax cross-entropy of ``input (N, C)`` against class indices (or probabilities).

    torch's ``F.cross_entropy`` (arguments in its order): with class indices ``target (N,)``,
    ``loss_i = log(sum_c exp(x_ic)) - x_i,t_i``, averaged over the rows by default.

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
    check_cross_entropy_args(weight, size_average, reduce, reduction, label_smoothing)
    (logits,) = autocast_args("cross_entropy", input)
    if logits.ndim != 2:
        raise ValueError(error("cross_entropy", f"input must be (N, C), got shape "
                               f"{logits.shape}. Flatten extra dims into N first "
                               "(logits.view(-1, logits.size(-1)))."))
    n, c = logits.shape
    t = as_array(target)
    if numpy.issubdtype(t.dtype, numpy.floating):  # class probabilities
        return cross_entropy_probs(logits, target, weight, reduction, label_smoothing)
    if not numpy.issubdtype(t.dtype, numpy.integer):
        raise ValueError(error("cross_entropy", f"target must hold integer class indices, got "
                               f"dtype {t.dtype}. Convert with .astype(int)."))
    if t.shape != (n,):
        raise ValueError(error("cross_entropy", f"target has shape {tuple(t.shape)} but input "
                               f"has shape {logits.shape}; target must be ({n},)."))
    xp = backend.get_array_module(logits.array)
    if xp is not numpy:
        return cross_entropy_gpu(logits, t, weight, ignore_index, reduction, label_smoothing)
    host = numpy.asarray(t)
    kept = check_labels(host, c, ignore_index)
    if weight is not None or label_smoothing or not kept.all():
        return cross_entropy_general(logits, host, kept, weight, ignore_index, reduction,
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
