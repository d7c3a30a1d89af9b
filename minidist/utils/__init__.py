"""Utilities that trade compute for memory and show where the memory goes.

    from minidist.utils import checkpoint, checkpoint_sequential, memory_report
    h = checkpoint(block, x)                     # recompute block's activations in backward
    y = checkpoint_sequential(model, 3, x)       # a Sequential in 3 checkpointed segments
    print(memory_report(model, optimizer, step=lambda: train_step(x, y)))

Modules: ``checkpointing`` (torch.utils.checkpoint's two functions; the mechanism lives
with the tape in ``minidist.tensor.checkpoint``), ``checkpoint`` (torch's module path for them,
callable as the function), ``memory`` (the per-rank memory report).
docs/memory.md explains both, with ZeRO-1 optimizer-state sharding (minidist.memory.zero).
"""

from minidist.utils import checkpoint  # the module, callable as the function (torch's path)
from minidist.utils.checkpointing import checkpoint_sequential
from minidist.utils.memory import MemoryReport, memory_report

__all__ = ["checkpoint", "checkpoint_sequential", "memory_report", "MemoryReport"]
