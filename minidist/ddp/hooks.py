"""Communication hooks: how a ready gradient bucket is turned into the average across ranks.

    ddp = DistributedDataParallel(model)
    ddp.register_comm_hook(None, allreduce_hook)                  # torch's default hook

A hook is ``hook(state, bucket) -> None``: it must leave ``bucket.buffer`` holding the
AVERAGE over ranks of what every rank had there, identically on every rank. ``bucket`` is the
DDP's ``Bucket`` (bucket.py: ``buffer``, ``index``, ``views``, ``names``, ``world_size``,
``divisor``, ``is_last``); ``bucket.all_reduce(array, op)`` reduces over the DDP's process
group with its algorithm. torch hooks return a Future; ours run synchronously, on DDP's
communication thread when overlap is on, which gives the same overlap without futures. A
hook that needs to act at other moments of the step carries a Reducer observer class as its
``observer`` attribute (observers.py); the Reducer registers one while the hook is in use.

Hooks here:
- ``avg_allreduce_hook``: DDP's default. The average is one all-reduce with op AVG: the
  algorithm sums and divides by n (the shared-memory one divides each piece of the sum while
  it is in cache, so the division costs no pass over the bucket).
- ``allreduce_hook``: the textbook average (torch's default hook): divide by n, all-reduce
  the sum. ``DistributedDataParallel(model, comm_hook=allreduce_hook)``.
- ``prescaled_allreduce_hook`` (prescaled.py, with ``FoldedAverage``, the Reducer observer it
  brings): the same average with the division folded into backward, a named fast path. The
  three are timed side by side by ``benchmarks/ddp_scaling.py --hooks 300``.

The compressing hooks, ``fp16_compress_hook`` and ``powersgd_hook`` (with ``PowerSGDState``),
are in compression.py. This module's names include all of them (``hooks.fp16_compress_hook``).
"""

from __future__ import annotations

from typing import Any, Callable

from minidist.ddp.bucket import Bucket
from minidist.ddp.prescaled import FoldedAverage, prescaled_allreduce_hook  # noqa: F401

GradBucket = Bucket  # torch's name for what a hook receives: the one bucket class


def allreduce_hook(state: Any, bucket: Bucket) -> None:
    """The textbook hook: the average of the bucket over the ranks.

    Each rank divides its gradients by n, then one all-reduce SUM adds them up: the sum of
    grad / n is the average (torch's ``allreduce_hook`` divides first too). n is
    ``bucket.divisor``: the world size, or under ``DistributedDataParallel.join()`` the number
    of ranks that trained this step.
    """
    if bucket.world_size > 1:  # the average over one rank is the bucket itself
        bucket.buffer /= bucket.divisor
        bucket.all_reduce(bucket.buffer, "sum")


def avg_allreduce_hook(state: Any, bucket: Bucket) -> None:
    """DDP's default hook: the average of the bucket over the ranks, one all-reduce AVG.

    AVG is the sum over the ranks divided by n, and the algorithm divides where it already
    holds the data: the shared-memory all-reduce divides each piece of its slice while the
    piece is in cache, before pushing it to the peers. Three cases go the textbook way
    (``allreduce_hook``: divide, then sum): one rank; ``DistributedDataParallel.join()``,
    where ``bucket.divisor`` (the ranks that trained) is not the world size; and float16
    buckets, where dividing first keeps the sum from overflowing.
    """
    if bucket.world_size == bucket.divisor > 1 and bucket.buffer.dtype.itemsize >= 4:
        bucket.all_reduce(bucket.buffer, "avg")
    else:
        allreduce_hook(state, bucket)


def averages_plainly(hook: Callable[..., Any]) -> bool:
    """True for the hooks that compute the plain average with one all-reduce per bucket (the
    default, the textbook one and the prescaled fast path): what ``join()`` can shadow with
    zeros."""
    return hook in (avg_allreduce_hook, allreduce_hook, prescaled_allreduce_hook)


def __getattr__(name: str) -> Any:  # hooks.fp16_compress_hook, ...: compression.py's names
    from minidist.ddp import compression
    return getattr(compression, name)
