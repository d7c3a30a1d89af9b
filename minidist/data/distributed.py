"""torch's ``torch.utils.data.distributed`` module name: ``DistributedSampler``.

    from minidist.data.distributed import DistributedSampler      # torch's import path, ported
    from minidist.utils.data.distributed import DistributedSampler    # the same class
"""

from minidist.data.sampler import DistributedSampler

__all__ = ["DistributedSampler"]
