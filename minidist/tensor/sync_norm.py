"""Batch normalization over a batch split across processes: the statistics and the backward's
two gradient sums are summed over every rank by a callable the caller passes in.

The tensor layer does not communicate; ``minidist.ddp.sync_batchnorm`` (above comm) hands in
``all_reduce_sum(flat_float64_array)``, which sums the array over the ranks in place. Per channel
c, with x_r the part of the batch on rank r (torch's SyncBatchNorm algorithm)::

    forward    [sum x_r, sum x_r^2, n_r] --all-reduce--> [S, Q, N]
               mean = S / N     var = Q / N - mean^2     (biased)
               xhat = (x - mean) / sqrt(var + eps)       y = xhat * weight + bias
    backward   [sum g, sum g * xhat] (this rank) --all-reduce--> [G, H]
               grad x      = weight / sqrt(var + eps) * (g - G / N - xhat * H / N)
               grad weight = sum g * xhat (this rank's part)   grad bias = sum g (this rank's part)

The weight/bias gradients stay local, as torch's: DDP then averages them with the others.
Sums are taken in float64, so ``Q / N - mean^2`` does not lose the variance to cancellation.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy

from minidist import xp as backend
from minidist.tensor.core import Tensor, error


def sync_batch_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float,
                    all_reduce_sum: Callable[[Any], Any]) -> tuple[Tensor, Any, Any, int]:
    """Normalize ``x (N, C, ...)`` per channel with statistics summed over all ranks.

    Args:
        x: this rank's part of the batch, (N, C) or (N, C, ...).
        weight, bias: (C,) Parameters, or None (no affine transform).
        eps: added to the variance.
        all_reduce_sum: sums a flat float64 array over the ranks, in place; called once in
            forward and once in backward (when ``x`` needs a gradient), on every rank alike.

    Returns:
        ``(y, mean, var, n)``: the output, the global per-channel mean and biased variance
        (float64 arrays), and the global number of values per channel.
    """
    if x.ndim < 2:
        raise ValueError(error("SyncBatchNorm", f"expected at least 2-D input (N, C, ...), got "
                               f"shape {x.shape}."))
    xp = backend.get_array_module(x.array)
    c = x.shape[1]
    axes = (0,) + tuple(range(2, x.ndim))
    shape = (1, c) + (1,) * (x.ndim - 2)
    x64 = x.array.astype(numpy.float64)
    local_n = math.prod(x.shape[i] for i in axes)
    stats = xp.concatenate([x64.sum(axis=axes), (x64 * x64).sum(axis=axes),
                            xp.asarray([float(local_n)])])
    all_reduce_sum(stats)
    n = int(round(float(stats[-1])))
    if n <= 1:
        raise ValueError(error("SyncBatchNorm", f"expected more than 1 value per channel over "
                               f"all ranks when training, got {n} (input shape {x.shape})."))
    mean = stats[:c] / n
    var = xp.maximum(stats[c:2 * c] / n - mean * mean, 0.0)
    invstd = 1.0 / xp.sqrt(var + eps)
    xhat = ((x64 - mean.reshape(shape)) * invstd.reshape(shape)).astype(x.dtype)
    out = xhat
    if weight is not None:
        out = out * weight.array.reshape(shape)
    if bias is not None:
        out = out + bias.array.reshape(shape)
    parents = tuple(t for t in (x, weight, bias) if t is not None)

    def backward(g: Any) -> tuple:
        g64 = g.astype(numpy.float64)
        sum_g = g64.sum(axis=axes)
        sum_g_xhat = (g64 * xhat).sum(axis=axes)
        grads: list[Any] = []
        if x.requires_grad:
            sums = xp.concatenate([sum_g, sum_g_xhat])
            all_reduce_sum(sums)
            w = 1.0 if weight is None else weight.array.astype(numpy.float64).reshape(shape)
            gx = w * invstd.reshape(shape) * (g64 - (sums[:c] / n).reshape(shape)
                                              - xhat * (sums[c:] / n).reshape(shape))
            grads.append(gx.astype(x.dtype))
        else:
            grads.append(None)
        if weight is not None:
            grads.append(sum_g_xhat.astype(weight.dtype))
        if bias is not None:
            grads.append(sum_g.astype(bias.dtype))
        return tuple(grads)

    return Tensor._make(out, parents, backward, "sync_batch_norm"), mean, var, n
