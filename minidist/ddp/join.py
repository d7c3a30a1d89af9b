"""The bookkeeping of ``DistributedDataParallel.join()``: training on uneven inputs.

Inside the block every synced forward first all-reduces a count of the ranks still
training (one 8-byte message; without ``join`` nothing is sent). A rank that leaves
the block keeps answering its peers' collectives with zeros until the count is 0::

    step   rank 0 (3 batches)      rank 1 (4)          rank 2 (5)
    0..2   count=3, train          count=3, train      count=3, train
    3      [exit] count 0, shadow  count=2, train      count=2, train
    4      count 0, shadow         [exit] shadow       count=1, train
    5      count 0 -> done         count 0 -> done     [exit] count 0 -> done
           then rank 2 (the last to leave) broadcasts its parameters and buffers

Shadowing a step = the buffer broadcast (``broadcast_buffers``) and every bucket's
comm hook on a zero bucket, in the order the training ranks run them and with their
divisor (so the hook makes the same calls), so nobody hangs. The summed gradients are
divided by the number of ranks that trained this step, so each step's gradient is the
exact average over the real batches.

The optimizer state (momentum, Adam moments) of a rank that left early is not
updated by the steps it shadowed; the parameters are (the final broadcast).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from minidist import comm
from minidist.logger import get_logger

log = get_logger("minidist.ddp.ddp")  # join's lines are DDP's


class Join:
    """The bookkeeping of one ``DistributedDataParallel.join()`` block."""

    def __init__(self, divide_by_initial_world_size: bool, shadow_step: Callable[[int], None],
                 broadcast_state: Callable[[int], None]) -> None:
        self.divide_by_initial_world_size = divide_by_initial_world_size
        self.shadow_step = shadow_step  # shadow_step(divisor): one synced step's collectives, zeros
        self.broadcast_state = broadcast_state  # parameters and buffers from a rank
        self.steps = 0  # synced forwards this rank trained inside the block
        self.count = np.zeros(1, dtype=np.int64)

    def count_active(self, ddp: Any, mine: int) -> int:
        """All-reduce how many ranks still train (``mine``: 1 training, 0 shadowing)."""
        self.count[0] = mine
        comm.all_reduce(self.count, op="sum", group=ddp.process_group)
        active = int(self.count[0])
        if mine:
            self.steps += 1
            ddp.reducer.divisor = self.divisor(ddp, active)
        return active

    def divisor(self, ddp: Any, active: int) -> int:
        """What this step's summed gradients are divided by (``active``: ranks that train)."""
        return ddp.world_size if self.divide_by_initial_world_size else active

    def shadow_until_all_joined(self, ddp: Any) -> None:
        """Shadow the others' steps until none trains; then the last to leave broadcasts."""
        shadowed = 0
        while (active := self.count_active(ddp, 0)) > 0:
            self.shadow_step(self.divisor(ddp, active))
            shadowed += 1
        counts = comm.all_gather_object(self.steps, group=ddp.process_group)
        src = counts.index(max(counts))  # a rank that trained every step holds the final model
        self.broadcast_state(src)
        if shadowed:
            log.info("join: trained %d steps, shadowed %d; final model from rank %d",
                     self.steps, shadowed, src)


__all__ = ["Join"]
