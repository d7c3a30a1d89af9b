"""``torch.distributed.algorithms`` by its path: the DDP communication hooks
(``ddp_comm_hooks``)."""

from minidist.distributed.algorithms import ddp_comm_hooks

__all__ = ["ddp_comm_hooks"]
