"""torch.nn.functional's leaky_relu, normalize, one_hot and the binary cross-entropies, each
with its gradient (the layers ``nn.LeakyReLU``, ``nn.BCELoss``, ``nn.BCEWithLogitsLoss`` call
these).

    d_loss = F.binary_cross_entropy(D(x).sigmoid(), ones)            # a GAN's discriminator
    loss = F.binary_cross_entropy_with_logits(logits, y, pos_weight=w)   # stable: no sigmoid
    q = F.normalize(encoder(x), dim=1)                                # unit rows (contrastive)

As torch: ``binary_cross_entropy`` clamps each log at -100 (so p = 0 or 1 gives a finite
loss) and its gradient divides by ``max(p (1 - p), 1e-12)``; the logits form computes
``max(x, 0) - x t + log(1 + e^-|x|)``, which never overflows, with the gradient
``sigmoid(x) - t`` (``pos_weight`` scales the positive term). Both also give the target a
gradient, as torch's do.
"""

from __future__ import annotations

from typing import Any

import numpy

from minidist import xp as backend
from minidist.tensor import mathops
from minidist.tensor.core import Tensor, error


def leaky_relu(input: Tensor, negative_slope: float = 0.01,  # noqa: A002 - torch's name
               inplace: bool = False) -> Tensor:
    """``x`` where positive, ``negative_slope * x`` elsewhere (the slope at 0, as torch);
    ``inplace`` is accepted and computed out of place."""
    x = input.array
    xp = backend.get_array_module(x)
    pos = x > 0
    out = xp.where(pos, x, x * negative_slope).astype(x.dtype, copy=False)
    return Tensor._make(out, (input,),
                        lambda g: (g * xp.where(pos, 1.0, negative_slope).astype(g.dtype),),
                        "leaky_relu")


def normalize(input: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12,  # noqa: A002
              out: Any = None) -> Tensor:
    """``x / max(||x||_p, eps)`` along ``dim`` (torch's ``F.normalize``), from tape ops."""
    norm = mathops.norm(input, p, dim, keepdim=True)
    return input / mathops.clamp(norm, min=eps)


def one_hot(tensor: Any, num_classes: int = -1) -> Tensor:
    """int64 (..., num_classes) with a 1 at each index (``-1``: the largest index + 1)."""
    idx = tensor.array if isinstance(tensor, Tensor) else backend.get_array_module(
        tensor).asarray(tensor)
    if idx.dtype.kind not in "iu":
        raise TypeError(error("one_hot", f"expects integer class indices (int64), got "
                              f"{idx.dtype}."))
    xp = backend.get_array_module(idx)
    if num_classes == -1:
        num_classes = int(idx.max()) + 1 if idx.size else 0
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= num_classes):
        raise ValueError(error("one_hot", f"class values must be in [0, {num_classes}), got "
                               f"[{int(idx.min())}, {int(idx.max())}]."))
    return Tensor((idx[..., None] == xp.arange(num_classes)).astype(numpy.int64))


def _reduce(op: str, loss: Any, reduction: str, size_average: Any, reduce: Any) -> Any:
    if size_average is not None or reduce is not None:
        raise ValueError(error(op, "size_average and reduce are deprecated in torch; pass "
                               "reduction='mean' | 'sum' | 'none' instead."))
    if reduction == "mean":
        return loss.mean(), 1.0 / max(loss.size, 1)
    if reduction == "sum":
        return loss.sum(), 1.0
    if reduction == "none":
        return loss, 1.0
    raise ValueError(error(op, f"reduction={reduction!r}; use 'mean', 'sum' or 'none'."))


def _as_tensor(v: Any, like: Tensor) -> Tensor:
    if isinstance(v, Tensor):
        return v
    xp = backend.get_array_module(like.array)
    return Tensor(xp.asarray(v, dtype=like.array.dtype))


def binary_cross_entropy(input: Tensor, target: Any, weight: Any = None,  # noqa: A002
                         size_average: Any = None, reduce: Any = None,
                         reduction: str = "mean") -> Tensor:
    """torch's ``F.binary_cross_entropy``: ``-w (t log p + (1 - t) log(1 - p))``, logs clamped
    at -100; ``input`` holds probabilities in [0, 1] and ``target`` has its shape."""
    t = _as_tensor(target, input)
    p, y = input.array, t.array
    if tuple(y.shape) != tuple(p.shape):
        raise ValueError(error("binary_cross_entropy", f"target of shape {tuple(y.shape)} must "
                               f"have the input's shape {tuple(p.shape)}."))
    xp = backend.get_array_module(p)
    if p.size and (bool((p < 0).any()) or bool((p > 1).any())):
        raise RuntimeError(error("binary_cross_entropy", "all elements of input should be "
                                 "between 0 and 1 (pass probabilities, e.g. sigmoid(logits), "
                                 "or use binary_cross_entropy_with_logits)."))
    w = None if weight is None else (weight.array if isinstance(weight, Tensor) else weight)
    with numpy.errstate(divide="ignore"):
        log_p, log_q = xp.maximum(xp.log(p), -100), xp.maximum(xp.log1p(-p), -100)
    loss = -(y * log_p + (1 - y) * log_q)
    if w is not None:
        loss = loss * w
    out, scale = _reduce("binary_cross_entropy", loss, reduction, size_average, reduce)

    def backward(g: Any) -> tuple:
        gs = g * scale
        gp = gs * (p - y) / xp.maximum(p * (1 - p), 1e-12)
        with numpy.errstate(divide="ignore"):  # torch's: unclamped (inf where p is 0 or 1)
            gy = gs * (xp.log1p(-p) - xp.log(p))
        if w is not None:
            gp, gy = gp * w, gy * w
        return gp.astype(p.dtype, copy=False), gy.astype(y.dtype, copy=False)

    return Tensor._make(xp.asarray(out, dtype=p.dtype), (input, t), backward,
                        "binary_cross_entropy")


def binary_cross_entropy_with_logits(input: Tensor, target: Any, weight: Any = None,  # noqa: A002
                                     size_average: Any = None, reduce: Any = None,
                                     reduction: str = "mean", pos_weight: Any = None) -> Tensor:
    """torch's ``F.binary_cross_entropy_with_logits``: the BCE of ``sigmoid(input)``, computed
    stably from the logits; ``pos_weight`` (broadcast over the last dim) weights positives."""
    t = _as_tensor(target, input)
    x, y = input.array, t.array
    if tuple(y.shape) != tuple(x.shape):
        raise ValueError(error("binary_cross_entropy_with_logits", f"target of shape "
                               f"{tuple(y.shape)} must have the input's shape {tuple(x.shape)}."))
    xp = backend.get_array_module(x)
    w = None if weight is None else (weight.array if isinstance(weight, Tensor) else weight)
    pw = None if pos_weight is None else (
        pos_weight.array if isinstance(pos_weight, Tensor) else xp.asarray(pos_weight))
    softplus_neg = xp.log1p(xp.exp(-xp.abs(x))) + xp.maximum(-x, 0)  # log(1 + e^-x)
    c = 1.0 if pw is None else 1 + (pw - 1) * y
    loss = (1 - y) * x + c * softplus_neg
    if w is not None:
        loss = loss * w
    out, scale = _reduce("binary_cross_entropy_with_logits", loss, reduction, size_average,
                         reduce)

    def backward(g: Any) -> tuple:
        gs = g * scale
        sig_neg = 0.5 * (1 - xp.tanh(0.5 * x))  # sigmoid(-x), no overflow
        gx = gs * ((1 - y) - c * sig_neg)
        gy = gs * (-x + (0 if pw is None else (pw - 1) * softplus_neg))
        if w is not None:
            gx, gy = gx * w, gy * w
        return gx.astype(x.dtype, copy=False), gy.astype(y.dtype, copy=False)

    return Tensor._make(xp.asarray(out, dtype=x.dtype), (input, t), backward,
                        "binary_cross_entropy_with_logits")


__all__ = ["leaky_relu", "normalize", "one_hot", "binary_cross_entropy",
           "binary_cross_entropy_with_logits"]
