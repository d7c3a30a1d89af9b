"""ZeRO-1's shards: the part of one DDP bucket a rank owns, as its inner optimizer sees it.

``BucketShard`` re-points a bucket's parameters at views of one flat array (once) and splits it in
n equal chunks plus a tiny tail; ``shard_part`` is the flat "parameter" over a chunk with its
gradient view; ``GradState`` says whether the shards hold this step's average.
``minidist.memory.zero`` builds and steps them.
"""

from __future__ import annotations

import enum
from typing import Any

from minidist import xp as backend
from minidist.tensor import Tensor


class GradState(enum.Enum):
    """Whether the gradient shards hold this step's average (set by the comm hook)."""

    STALE = "stale"   # no synced backward since the last step()
    READY = "ready"   # every bucket was reduce-scattered


class BucketShard:
    """One bucket's part owned by this rank: what the inner optimizer sees as parameters.

    The bucket's N elements split as ``n`` equal chunks of c = N // n, then a tail of
    N - n c < n elements. Rank r owns chunk r; the tail is tiny, so every rank averages it
    with a small all-reduce and steps it (identically) itself: no padding, no extra copy of
    the bucket::

        flat (N)   | chunk 0 | chunk 1 | ... | chunk n-1 | tail |
        rank r     owns chunk r (optimizer state for c elements) and the tail (< n elements)
    """

    def __init__(self, bucket: Any, rank: int, world_size: int) -> None:
        self.index = bucket.index
        self.numel = bucket.spec.numel
        self.chunk = self.numel // world_size                 # c
        self.split = self.chunk * world_size                  # where the tail starts
        self.lo = rank * self.chunk
        xp = backend.get_array_module(bucket.buffer)
        dtype = bucket.buffer.dtype
        self.flat = xp.zeros(self.numel, dtype=dtype)  # every parameter of the bucket (zeros
        #                                                 between them: the bucket's padding)
        for p, off in zip(bucket.params, bucket.spec.offsets):
            n = p.array.size
            self.flat[off:off + n] = p.array.reshape(-1)
            p.array = self.flat[off:off + n].reshape(p.array.shape)   # rebound once, here
        # the reduce-scatter's output; after the step, the all-gather's input
        self.own_buffer = world_size > 1
        self.grad_shard = (bucket.buffer if world_size == 1  # one rank: the bucket is the mean
                           else xp.zeros(self.chunk, dtype=dtype))
        self.parts = [shard_part(self.flat[self.lo:self.lo + self.chunk], self.grad_shard),
                      shard_part(self.flat[self.split:], bucket.buffer[self.split:])]
        self.offsets = list(bucket.spec.offsets)
        self.params = list(bucket.params)

    def nbytes(self) -> int:
        return int(self.grad_shard.nbytes) if self.own_buffer else 0


def shard_part(data: Any, grad: Any) -> Tensor:  # noqa: N802 - builds what it names
    """A flat "parameter" of the inner optimizer: a Tensor over a view of the parameters,
    whose ``.grad`` is the matching view of the gradients."""
    part = Tensor(data)
    part.grad = grad
    return part
