"""Wing: memory, training bigger models on the same ranks (docs/memory.md).

    from minidist.ddp import ZeroRedundancyOptimizer      # the public path (the root names it)
    opt = ZeroRedundancyOptimizer(model.parameters(), optim.AdamW, lr=1e-3)

    zero.py     ZeRO-1: each rank keeps and steps 1/n of the optimizer state, over DDP's
                buckets, and broadcasts its updated shard
    zero_shard.py      one bucket's shard, as the inner optimizer sees it
    zero_partition.py  without DDP's buckets: whole parameters partitioned (torch's way)

Activation checkpointing and the memory report are torch's ``torch.utils`` paths
(minidist/utils/), in this wing too.
"""
