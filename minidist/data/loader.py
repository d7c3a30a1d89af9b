"""DataLoader: batches ``(x, y)`` of a dataset as Tensors, in sampler or shuffled order.

    loader = DataLoader(train_set, batch_size=64, shuffle=True, seed=0)     # one process
    loader = DataLoader(train_set, batch_size=64,
                        sampler=DistributedSampler(train_set, seed=0))     # one shard per rank
    for epoch in range(epochs):
        loader.set_epoch(epoch)                  # passed on to the sampler
        for x, y in loader: ...

A batch is what torch's DataLoader yields: Tensors (no gradient), so a training loop's
``xb.to(device)``, ``yb.long()``, ``xb.size(0)``, ``xb.float()`` work as they are. Each Tensor
wraps the batch's array without a copy (``xb.array`` is the NumPy or CuPy array, and
``numpy.asarray(xb)`` gives it back), so nothing costs more than it did with arrays. For an
``ArrayDataset`` or ``TensorDataset`` (and a ``Subset`` of one, e.g. from ``random_split``) a
batch is ONE fancy-indexing step per array (``x[idx]``, ``y[idx]``), no per-sample Python loop;
other datasets (``len`` + ``__getitem__``) are batched sample by sample by ``default_collate``
(Tensors, arrays and numbers; tuples and dicts field by field). Batches are moved to
``device`` (default: minidist's default device; on the CPU that is a no-op). A ``collate_fn``
replaces all of this: the loader yields what it returns.

With ``num_workers=N > 0``, N background threads build the next batches ahead
(``minidist/data/prefetch.py``); the batches are the same.

Order: with a sampler, the sampler's ``local_indices()``; with ``shuffle=True``, pass k uses
``numpy.random.default_rng(seed + k)``, where k counts passes and ``set_epoch(e)`` sets it to e
(so both "call set_epoch every epoch" and "never call it" give a new order each epoch).
"""

from __future__ import annotations

import math
from collections.abc import Generator, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import numpy as np

from minidist import xp as backend
from minidist.tensor import Tensor
from minidist.data import prefetch
from minidist.data.collate import default_collate
from minidist.data.datasets import ArrayDataset, Subset, TensorDataset
from minidist.data.resume import LoaderState, pass_ended, pass_started
from minidist.data.sampler import DistributedSampler


def _to_device(batch: Any, device: str | None) -> Any:
    """The Tensors of a collated batch moved to ``device`` (the loader's, or the default)."""
    if isinstance(batch, Tensor):
        return Tensor(backend.to_device(batch.array, device))
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(_to_device(v, device) for v in batch)
    return batch


class DataLoader(LoaderState):
    """Iterate over a dataset in batches (torch's arguments, in torch's order).

    Args:
        dataset: an ArrayDataset or TensorDataset (fast path: one indexing step per array per
            batch) or any dataset of samples (``len`` + ``__getitem__``), e.g. a ``Dataset``
            subclass returning ``(x, y)``.
        batch_size: samples per batch.
        shuffle: shuffle each pass (not allowed together with ``sampler``; the sampler shuffles).
        sampler: a DistributedSampler (or anything with ``local_indices()``/``__iter__``).
        batch_sampler: not supported (raises ValueError); use ``sampler`` and ``batch_size``.
        num_workers: background threads that prefetch batches (0: build them in the loop).
        collate_fn: ``collate_fn(list_of_samples) -> batch``; replaces the default, which
            stacks each field of the samples into a Tensor (``default_collate``).
        pin_memory: accepted; a no-op (NumPy batches are copied to a GPU when ``device`` says).
        drop_last: drop the last batch if it is smaller than ``batch_size``.
        timeout: seconds to wait for a prefetched batch (0: no limit).
        worker_init_fn: called as ``worker_init_fn(worker_id)`` in each worker thread.
        prefetch_factor: batches in flight per worker (torch's default: 2).
        persistent_workers: keep the worker threads between passes (needs num_workers > 0).
        multiprocessing_context: must stay None (the workers are threads).
        generator: a ``minidist.Generator`` (or ``numpy.random.Generator``) to draw each
            pass's shuffle from, as torch: each pass takes the generator's next permutation,
            so a seeded generator gives the same sequence of orders run after run (without
            it, the shuffle follows ``seed`` and the pass number).
        seed: base seed of the shuffle.
        device: "cpu" or "cuda" for the batches (default: ``minidist.xp.default_device()``).

    ``state_dict``/``load_state_dict``/``resume_at`` (mid-epoch resume) are inherited:
    ``data/resume.py``.

    Raises:
        ValueError: batch_size < 1, shuffle=True together with a sampler, num_workers < 0,
            persistent_workers without workers, or a batch_sampler.
    """

    def __init__(self, dataset: Any, batch_size: int = 1, shuffle: bool = False,
                 sampler: DistributedSampler | None = None, batch_sampler: Any = None,
                 num_workers: int = 0, collate_fn: Callable[[list], Any] | None = None,
                 pin_memory: bool = False, drop_last: bool = False, timeout: float = 0,
                 worker_init_fn: Callable[[int], None] | None = None,
                 multiprocessing_context: Any = None, generator: Any = None, *,
                 prefetch_factor: int | None = None, persistent_workers: bool = False,
                 seed: int = 0, device: str | None = None) -> None:
        if batch_size is None or batch_size < 1:
            raise ValueError(f"DataLoader: batch_size={batch_size} must be >= 1.")
        if shuffle and sampler is not None:
            raise ValueError("DataLoader: shuffle=True and a sampler were both given; the sampler "
                             "decides the order. Pass shuffle to the sampler instead "
                             "(DistributedSampler(..., shuffle=True)).")
        if multiprocessing_context is not None:
            raise ValueError("DataLoader: multiprocessing_context is not supported; the workers "
                             "are threads (leave it None).")
        if batch_sampler is not None:
            raise ValueError("DataLoader: batch_sampler is not supported; pass sampler= and "
                             "batch_size= instead.")
        if num_workers < 0:
            raise ValueError(f"DataLoader: num_workers={num_workers} must be >= 0.")
        if persistent_workers and num_workers == 0:
            raise ValueError("DataLoader: persistent_workers=True needs num_workers > 0 (there "
                             "are no workers to keep).")
        if prefetch_factor is not None and prefetch_factor < 1:
            raise ValueError(f"DataLoader: prefetch_factor={prefetch_factor} must be >= 1.")
        self.dataset, self.batch_size = dataset, int(batch_size)
        self.shuffle, self.sampler, self.drop_last = bool(shuffle), sampler, bool(drop_last)
        self.num_workers, self.collate_fn = int(num_workers), collate_fn
        self.pin_memory = pin_memory
        self.timeout, self.worker_init_fn = timeout, worker_init_fn
        self.prefetch_factor = 2 if prefetch_factor is None else int(prefetch_factor)
        self.persistent_workers = bool(persistent_workers)
        self.seed, self.device, self.generator = int(seed), device, generator
        self.epoch = 0
        self._pool: ThreadPoolExecutor | None = None
        # mid-epoch position: the pass in progress and the batches it has yielded; a loaded
        # state makes the next pass start at batch ``_resume_at`` (see state_dict)
        self._pass_epoch, self._yielded, self._resume_at = 0, 0, 0

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
        if self.shuffle and self.generator is not None:  # torch's: the generator's next draws
            return self.generator.permutation(n)
        if self.shuffle:
            return np.random.default_rng(self.seed + self.epoch).permutation(n)
        return np.arange(n)

    def _num_samples(self) -> int:
        return len(self.sampler) if self.sampler is not None else len(self.dataset)

    def __len__(self) -> int:
        n = self._num_samples()
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def gather(self, idx: np.ndarray) -> Any:
        """One batch: the collate_fn's result, or Tensors (``default_collate``) on ``device``."""
        if self.collate_fn is not None:
            return self.collate_fn([self.dataset[int(i)] for i in idx])
        dataset = self.dataset
        while isinstance(dataset, Subset):  # a split of an array dataset keeps the fast path
            idx, dataset = dataset.index_array()[idx], dataset.dataset
        if isinstance(dataset, ArrayDataset):
            fields: tuple = (dataset.x[idx], dataset.y[idx])
        elif isinstance(dataset, TensorDataset):
            fields = tuple(a[idx] for a in dataset.tensors)
        else:
            return _to_device(default_collate([dataset[int(i)] for i in idx]), self.device)
        return tuple(Tensor(backend.to_device(f, self.device)) for f in fields)

    def _batches(self) -> Iterator[tuple[Any, slice, int]]:
        """``(batch, its slice of this pass's indices, its size)`` in order (prefetched)."""
        order = self.indices()
        self._pass_epoch = self.epoch
        if self.sampler is None:
            self.epoch += 1  # the next pass shuffles anew even without set_epoch
        start, self._resume_at = self._resume_at, 0  # a loaded mid-epoch state: skip ahead
        self._yielded = start
        slices = [slice(b * self.batch_size, (b + 1) * self.batch_size)
                  for b in range(start, len(self))]
        if self.num_workers == 0:
            batches: Generator[Any, None, None] = (self.gather(order[sl]) for sl in slices)
        else:                                        # built ahead by worker threads
            batches = prefetch.prefetched(self, order, slices)
        running = pass_started() if isinstance(self.sampler, DistributedSampler) else None
        try:
            for batch, sl in zip(batches, slices):
                if running:  # where every rank stands in step (resume.py: batch_position)
                    running.position = (self._pass_epoch, self._yielded)
                self._yielded += 1
                yield batch, sl, len(order[sl])
            self._pass_epoch, self._yielded = self._pass_epoch + 1, 0  # between passes
        finally:
            batches.close()                          # a loop left early: stop building
            if running:
                pass_ended(running)

    def iter_with_mask(self) -> Iterator[tuple[Any, ...]]:
        """Like iteration, with a host bool array appended per batch: False marks padding.

        For exact distributed evaluation (see ``DistributedSampler.valid_mask``). A batch of
        ``(x, y)`` comes as ``(x, y, mask)``: x and y Tensors, mask a NumPy bool array.
        """
        valid = None
        if hasattr(self.sampler, "valid_mask"):
            valid = self.sampler.valid_mask()
        for batch, sl, n in self._batches():
            mask = valid[sl] if valid is not None else np.ones(n, dtype=bool)
            yield (*batch, mask) if isinstance(batch, tuple) else (batch, mask)

    def __iter__(self) -> Iterator[Any]:
        for batch, _, _ in self._batches():
            yield batch

    def _stop_workers(self) -> None:
        prefetch.stop_workers(self)

    def __del__(self) -> None:
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
