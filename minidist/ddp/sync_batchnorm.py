"""``SyncBatchNorm``: batch normalization with statistics over the global batch (torch's
``nn.SyncBatchNorm``), and ``convert_sync_batchnorm`` to swap it in for BatchNorm layers.

    model = nn.SyncBatchNorm.convert_sync_batchnorm(model)     # before wrapping in DDP
    ddp = DistributedDataParallel(model)

In training each forward all-reduces per-channel ``[sum x, sum x^2, count]`` and each backward
``[sum g, sum g * xhat]`` (one message each; the math is ``minidist.tensor.sync_batch_norm``), so
every rank normalizes with the mean and variance of the whole batch and gets the input gradient
that BatchNorm on the whole batch would give. In eval mode, or without an initialized process
group of more than one rank, it is an ordinary BatchNorm (as torch).

It lives in ``ddp`` because it communicates (``nn`` sits below ``comm`` in the layer order);
``minidist.nn.SyncBatchNorm`` is this class, attached by the package root so torch's spelling
works. Under DDP the comm thread is not used with it (``overlap="auto"`` picks False): the
backward's all-reduce runs on the main thread, in the same order on every rank, before the
bucket reductions start.
"""

from __future__ import annotations

from typing import Any

from minidist import comm
from minidist.nn import Module
from minidist.nn.norm import BatchNormBase
from minidist.tensor import Tensor, no_grad, sync_batch_norm
from minidist.tensor.core import error


class SyncBatchNorm(BatchNormBase):
    """torch's ``nn.SyncBatchNorm(num_features, eps, momentum, affine, track_running_stats,
    process_group)``; inputs (N, C, ...), keys as BatchNorm's.

    Args:
        process_group: the ranks whose batches are normalized together (default: the world).
    """

    _dims: tuple[int, ...] = ()  # any rank >= 2

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True,
                 process_group: Any = None, device: Any = None, dtype: Any = None) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_group = process_group
        if device is not None or dtype is not None:
            self.to(*(a for a in (device, dtype) if a is not None))

    def _group(self) -> Any:
        """The process group to sync over, or None to act as a plain BatchNorm."""
        if not comm.is_initialized():
            return None
        group = self.process_group or comm.get_default_group()
        return group if group.size > 1 else None

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim < 2 or x.shape[1] != self.num_features:
            raise ValueError(error("SyncBatchNorm", f"expected input (N, {self.num_features}, "
                                   f"...) with at least 2 dims, got shape {x.shape}."))
        group = self._group() if self.training else None
        if group is None:
            return self._local_forward(x)

        def all_reduce_sum(array: Any) -> Any:
            return comm.all_reduce(array, "sum", group=group, label="sync_batchnorm")

        out, mean, var, n = sync_batch_norm(x, self.weight, self.bias, self.eps, all_reduce_sum)
        if self.track_running_stats:
            self.update_running_stats(mean, var, n)
        return out

    def _local_forward(self, x: Tensor) -> Tensor:
        """BatchNorm's forward on this rank's batch (any input rank >= 2)."""
        saved, self._dims = self._dims, (x.ndim,)
        try:
            return BatchNormBase.forward(self, x)
        finally:
            self._dims = saved

    @classmethod
    def convert_sync_batchnorm(cls, module: Module, process_group: Any = None) -> Module:
        """Replace every BatchNorm1d/2d in ``module`` by a SyncBatchNorm sharing its
        parameters and buffers (the same objects, so an optimizer built before still works);
        returns the converted module (a new object if ``module`` itself was a BatchNorm)."""
        out = module
        if isinstance(module, BatchNormBase) and not isinstance(module, SyncBatchNorm):
            out = cls(module.num_features, module.eps, module.momentum, module.affine,
                      module.track_running_stats, process_group)
            with no_grad():
                if module.affine:
                    out.weight, out.bias = module.weight, module.bias
                for name, buf in module.named_buffers():
                    if "." not in name:
                        out.register_buffer(name, buf)
            out.train(module.training)
        for name, child in list(module.named_children()):
            setattr(out, name, cls.convert_sync_batchnorm(child, process_group))
        return out
