"""``torch.nn.parallel`` by its path, as ``minidist.nn.parallel``:

    from minidist.nn.parallel import DistributedDataParallel as DDP

DistributedDataParallel communicates, so it lives in ``minidist.ddp`` (above comm); the
package root makes this module ``minidist.nn.parallel`` (nn sits below ddp and cannot import
it), as it does for ``nn.SyncBatchNorm``.
"""

from minidist.ddp.ddp import DistributedDataParallel

__all__ = ["DistributedDataParallel"]
