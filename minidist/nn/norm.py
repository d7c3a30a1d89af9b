"""Batch normalization (torch's ``BatchNorm1d``/``BatchNorm2d``): batch statistics in training,
running statistics in evaluation.

    bn = nn.BatchNorm2d(16)          # keys: weight, bias, running_mean, running_var,
    y = bn(x)                        #       num_batches_tracked (torch's, in torch's order)

Per channel c, over the batch (and length/height/width) axes::

    training:  y = (x - mean_B) / sqrt(var_B + eps) * weight + bias      var_B: biased (/n)
               running_mean <- (1 - momentum) running_mean + momentum mean_B
               running_var  <- (1 - momentum) running_var  + momentum var_B * n / (n - 1)
               num_batches_tracked += 1
    eval:      y = (x - running_mean) / sqrt(running_var + eps) * weight + bias

Under DistributedDataParallel each rank normalizes with its own batch (torch's BatchNorm; for
statistics over the global batch use ``nn.SyncBatchNorm``, minidist/ddp/sync_batchnorm.py); with
``broadcast_buffers=True`` (the default) DDP broadcasts rank 0's running
statistics before every synced forward, so the ranks' statistics do not drift apart.
"""

from __future__ import annotations

import math
from typing import Any

import numpy

from minidist import xp as backend
from minidist.nn import init
from minidist.nn.layers import empty_parameter, factory_dtype, place
from minidist.nn.module import Module
from minidist.tensor import Tensor, no_grad
from minidist.tensor.core import error


class BatchNormBase(Module):
    """Shared by BatchNorm1d/2d and SyncBatchNorm (torch's ``_BatchNorm``): parameters,
    buffers, running-statistics update; ``_dims`` lists the accepted input ranks."""

    _dims: tuple[int, ...] = ()

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True, device: Any = None,
                 dtype: Any = None, *, bias: bool = True) -> None:
        super().__init__()
        dtype = factory_dtype(dtype)
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        xp = backend.default_array_module()
        if affine:
            self.weight = init.ones_(empty_parameter(num_features, dtype=dtype))
            self.bias = empty_parameter(num_features, dtype=dtype) if bias else None
        else:
            self.weight = self.bias = None
        if track_running_stats:
            self.register_buffer("running_mean", xp.zeros(num_features, dtype))
            self.register_buffer("running_var", xp.ones(num_features, dtype))
            self.register_buffer("num_batches_tracked", xp.zeros((), numpy.int64))
        place(self, device)

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim not in self._dims or x.shape[1] != self.num_features:
            raise ValueError(error(type(self).__name__, f"expected input of rank {self._dims} "
                                   f"with {self.num_features} channels in dim 1, got shape "
                                   f"{x.shape}."))
        axes = (0,) + tuple(range(2, x.ndim))
        shape = (1, self.num_features) + (1,) * (x.ndim - 2)
        use_batch = self.training or not self.track_running_stats
        if use_batch:
            n = math.prod(x.shape[i] for i in axes)
            if self.training and n <= 1:
                raise ValueError(error(type(self).__name__, f"expected more than 1 value per "
                                       f"channel when training, got input shape {x.shape}."))
            mean = x.mean(axis=axes, keepdims=True)
            centered = x - mean
            var = (centered * centered).mean(axis=axes, keepdims=True)
            if self.training and self.track_running_stats:
                self.update_running_stats(mean.data.reshape(-1), var.data.reshape(-1), n)
        else:
            centered = x - Tensor(self.running_mean.data.reshape(shape).astype(x.dtype))
            var = Tensor(self.running_var.data.reshape(shape).astype(x.dtype))
        out = centered / (var + self.eps) ** 0.5
        if self.weight is not None:
            out = out * self.weight.reshape(shape)
        if self.bias is not None:
            out = out + self.bias.reshape(shape)
        return out

    def update_running_stats(self, mean: Any, var: Any, n: int) -> None:
        """Fold one batch's per-channel ``mean`` and biased ``var`` over ``n`` values into the
        running statistics (the variance enters unbiased, ``* n / (n - 1)``, as torch)."""
        with no_grad():
            self.num_batches_tracked.data[...] += 1
            m = (1.0 / int(self.num_batches_tracked.data) if self.momentum is None
                 else self.momentum)  # momentum=None: a cumulative average, as torch
            rm, rv = self.running_mean.data, self.running_var.data
            rm[...] = (1 - m) * rm + m * mean.astype(rm.dtype)
            rv[...] = (1 - m) * rv + m * (var * n / (n - 1)).astype(rv.dtype)

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
                f"affine={self.affine}, track_running_stats={self.track_running_stats}")


class BatchNorm1d(BatchNormBase):
    """Batch norm over (N, C) or (N, C, L) inputs, per channel C."""

    _dims = (2, 3)


class BatchNorm2d(BatchNormBase):
    """Batch norm over (N, C, H, W) inputs, per channel C."""

    _dims = (4,)


class GroupNorm(Module):
    """torch's ``nn.GroupNorm(num_groups, num_channels, eps=1e-5, affine=True, device=None,
    dtype=None)``: normalize each sample over groups of channels, in training and eval alike.

    For x (N, C, *), the C channels split into ``num_groups`` groups of C / G; each sample's
    group is normalized with its own mean and biased variance, then each channel is scaled and
    shifted by ``weight``/``bias`` (ones/zeros; none with ``affine=False``). No running
    statistics, so the batch size does not matter (GroupNorm(1, C) is a LayerNorm over
    (C, *), GroupNorm(C, C) an InstanceNorm).

    >>> import minidist
    >>> from minidist import nn
    >>> nn.GroupNorm(2, 4)(minidist.randn(3, 4, 5, 5)).shape
    (3, 4, 5, 5)
    """

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5,
                 affine: bool = True, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        if num_groups <= 0 or num_channels % num_groups:
            raise ValueError(error("GroupNorm", f"num_channels ({num_channels}) must be "
                                   f"divisible by num_groups ({num_groups})."))
        dtype = factory_dtype(dtype)
        self.num_groups, self.num_channels, self.eps, self.affine = (num_groups, num_channels,
                                                                     eps, affine)
        if affine:
            self.weight = init.ones_(empty_parameter(num_channels, dtype=dtype))
            self.bias = empty_parameter(num_channels, dtype=dtype)
        else:
            self.weight = self.bias = None
        place(self, device)

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim < 2 or x.shape[1] != self.num_channels:
            raise ValueError(error("GroupNorm", f"expected input (N, {self.num_channels}, *), "
                                   f"got shape {x.shape}."))
        n = x.shape[0]
        groups = x.reshape(n, self.num_groups, -1)
        centered = groups - groups.mean(axis=2, keepdims=True)
        var = (centered * centered).mean(axis=2, keepdims=True)
        out = (centered * (var + self.eps) ** -0.5).reshape(*x.shape)
        shape = (1, self.num_channels) + (1,) * (x.ndim - 2)
        if self.weight is not None:
            out = out * self.weight.reshape(shape) + self.bias.reshape(shape)
        return out

    def extra_repr(self) -> str:
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}"
