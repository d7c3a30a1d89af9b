"""DataLoader: batches ``(x, y)`` of a dataset as xp arrays, in sampler or shuffled order.

    loader = DataLoader(train_set, batch_size=64, shuffle=True, seed=0)     # one process
    loader = DataLoader(train_set, batch_size=64,
                        sampler=DistributedSampler(train_set, seed=0))     # one shard per rank
    for epoch in range(epochs):
        loader.set_epoch(epoch)                  # passed on to the sampler
        for x, y in loader: ...

For an ``ArrayDataset`` a batch is ONE fancy-indexing step per array (``x[idx]``, ``y[idx]``),
no per-sample Python loop; other datasets (``len`` + ``__getitem__`` returning (x, y)) are
stacked sample by sample. Batches are moved to ``device`` (default: minidist's default device;
on the CPU that is a no-op).

Order: with a sampler, the sampler's ``local_indices()``; with ``shuffle=True``, pass k uses
``numpy.random.default_rng(seed + k)``, where k counts passes and ``set_epoch(e)`` sets it to e
(so both "call set_epoch every epoch" and "never call it" give a new order each epoch).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from minidist import xp as backend
from minidist.data.datasets import ArrayDataset
from minidist.data.sampler import DistributedSampler


class DataLoader:
    """Iterate over a dataset in batches.

    Args:
        dataset: an ArrayDataset (fast path) or any dataset of (x, y) samples.
        batch_size: samples per batch.
        shuffle: shuffle each pass (not allowed together with ``sampler``; the sampler shuffles).
        sampler: a DistributedSampler (or anything with ``local_indices()``/``__iter__``).
        drop_last: drop the last batch if it is smaller than ``batch_size``.
        seed: base seed of the shuffle.
        device: "cpu" or "cuda" for the batches (default: ``minidist.xp.default_device()``).

    Raises:
        ValueError: batch_size < 1, or shuffle=True together with a sampler.
    """

    def __init__(self, dataset: Any, batch_size: int = 1, shuffle: bool = False,
                 sampler: DistributedSampler | None = None, drop_last: bool = False,
                 seed: int = 0, device: str | None = None) -> None:
        if batch_size < 1:
            raise ValueError(f"DataLoader: batch_size={batch_size} must be >= 1.")
        if shuffle and sampler is not None:
            raise ValueError("DataLoader: shuffle=True and a sampler were both given; the sampler "
                             "decides the order. Pass shuffle to the sampler instead "
                             "(DistributedSampler(..., shuffle=True)).")
        self.dataset, self.batch_size = dataset, int(batch_size)
        self.shuffle, self.sampler, self.drop_last = bool(shuffle), sampler, bool(drop_last)
        self.seed, self.device = int(seed), device
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Choose the shuffle of ``epoch``; passed on to the sampler's ``set_epoch``."""
        self.epoch = int(epoch)
        if self.sampler is not None and hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def indices(self) -> np.ndarray:
        """The sample indices of the current pass, in order (before batching)."""
        if self.sampler is not None:
            if hasattr(self.sampler, "local_indices"):
                return self.sampler.local_indices()
            return np.fromiter(iter(self.sampler), dtype=np.int64)
        n = len(self.dataset)
        if self.shuffle:
            return np.random.default_rng(self.seed + self.epoch).permutation(n)
        return np.arange(n)

    def _num_samples(self) -> int:
        return len(self.sampler) if self.sampler is not None else len(self.dataset)

    def __len__(self) -> int:
        n = self._num_samples()
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def _gather(self, idx: np.ndarray) -> tuple[Any, Any]:
        if isinstance(self.dataset, ArrayDataset):
            xb, yb = self.dataset.x[idx], self.dataset.y[idx]
        else:
            samples = [self.dataset[int(i)] for i in idx]
            xb = np.stack([np.asarray(s[0]) for s in samples])
            yb = np.stack([np.asarray(s[1]) for s in samples])
        return backend.to_device(xb, self.device), backend.to_device(yb, self.device)

    def iter_with_mask(self) -> Iterator[tuple[Any, Any, np.ndarray]]:
        """Like iteration, plus a host bool array per batch: False marks sampler padding.

        For exact distributed evaluation (see ``DistributedSampler.valid_mask``).
        """
        order = self.indices()
        valid = (self.sampler.valid_mask() if hasattr(self.sampler, "valid_mask")
                 else np.ones(len(order), dtype=bool))
        if self.sampler is None:
            self.epoch += 1  # the next pass shuffles anew even without set_epoch
        for b in range(len(self)):
            sl = slice(b * self.batch_size, (b + 1) * self.batch_size)
            xb, yb = self._gather(order[sl])
            yield xb, yb, valid[sl]

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        for xb, yb, _ in self.iter_with_mask():
            yield xb, yb
