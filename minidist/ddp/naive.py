"""Naive data parallelism: after backward, one averaging all-reduce per gradient.

    model = NaiveDataParallel(build_model())      # broadcasts rank 0's parameters
    loss_fn(model(x), y).backward()               # local gradients only
    model.all_reduce_gradients()                  # one all_reduce(avg) per parameter
    opt.step()                                    # same grads -> same update everywhere

The first rung of docs/course.md and the oracle of ``DistributedDataParallel``: both must give
the same averaged gradients (tests/ddp/test_naive.py). What DDP adds on top, and why:

    naive:  backward ............ | ar(p_k) ar(p_k-1) ... ar(p_1)       P messages, after backward
    DDP:    backward .. ar(b_1) .. ar(b_2) ..|                          B << P buckets, overlapped

Cost: P all-reduces of small messages, each paying the per-message latency alpha at least once,
and nothing overlaps with compute; bucketing (bucket.py) and overlap (reducer.py) remove both.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minidist import comm


class NaiveDataParallel:
    """Average every gradient with its own all-reduce when asked; no buckets, no overlap.

    Args:
        module: the model; every rank must build the same one.
        process_group: the group to reduce over (default: the world).
        algorithm: all-reduce algorithm, as ``comm.all_reduce`` takes it (default: the group's).
    """

    def __init__(self, module: Any, process_group: Any = None,
                 algorithm: str | None = None) -> None:
        self.module, self.process_group, self.algorithm = module, process_group, algorithm
        self.params = [p for p in module.parameters() if p.requires_grad]
        for p in self.params:  # every rank starts from rank 0's weights
            comm.broadcast(p.array, src=0, group=process_group)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def all_reduce_gradients(self) -> int:
        """Replace every ``p.grad`` by its average over the ranks; returns the all-reduce count.

        A parameter without a gradient on this rank contributes zeros, so every rank still
        calls the same all-reduces in the same order.
        """
        for p in self.params:
            if p.grad is None:
                p.grad = np.zeros_like(p.array)
            comm.all_reduce(p.grad.array, op="avg", algorithm=self.algorithm,
                            group=self.process_group)
        return len(self.params)
