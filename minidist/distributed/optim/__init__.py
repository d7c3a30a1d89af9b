"""``torch.distributed.optim`` by its path: ``ZeroRedundancyOptimizer`` (minidist/ddp/zero.py).

    from minidist.distributed.optim import ZeroRedundancyOptimizer
"""

from minidist.ddp.zero import ZeroRedundancyOptimizer

__all__ = ["ZeroRedundancyOptimizer"]
