"""torch's ``F.nll_loss`` and ``F.mse_loss`` (not in the spine's reading path), and the check
of the ``reduction`` argument every loss shares.

    loss = nll_loss(log_softmax(logits, 1), target)     # == cross_entropy(logits, target)
    loss = mse_loss(pred, target, reduction="sum")

Under autocast mse_loss runs in float32 (float16 inputs are cast up on the tape first), as
torch's autocast does.
"""

from __future__ import annotations

from typing import Any

import numpy

from minidist import xp as backend
from minidist.envvars import env
from minidist.tensor.autocast_mode import autocast_args
from minidist.tensor.core import Tensor, as_array, error

REDUCTIONS = ("mean", "sum", "none")


def check_reduction(op: str, reduction: str) -> None:
    """Raise ValueError unless ``reduction`` is one of ``REDUCTIONS``."""
    if reduction not in REDUCTIONS:
        raise ValueError(error(op, f"reduction must be one of {REDUCTIONS}, got {reduction!r}."))


def nll_loss(input: Tensor, target: Any, reduction: str = "mean") -> Tensor:  # noqa: A002
    """Negative log-likelihood: ``-input[i, target[i]]`` for log-probabilities ``input (N, C)``.

    ``nll_loss(log_softmax(x), t) == cross_entropy(x, t)`` (the pair torch models often use).
    """
    check_reduction("nll_loss", reduction)
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
    check_reduction("mse_loss", reduction)
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


__all__ = ["REDUCTIONS", "check_reduction", "mse_loss", "nll_loss"]
