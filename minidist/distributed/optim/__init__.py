"""``torch.distributed.optim`` by its path: ``ZeroRedundancyOptimizer`` (minidist/memory/zero.py).

    from minidist.distributed.optim import ZeroRedundancyOptimizer
"""

from minidist.memory.zero import ZeroRedundancyOptimizer

__all__ = ["ZeroRedundancyOptimizer"]
