"""DistributedSampler: which sample indices each rank reads, with torch's exact semantics.

    sampler = DistributedSampler(train_set, shuffle=True, seed=0)   # world size/rank from comm
    loader = DataLoader(train_set, batch_size=32, sampler=sampler)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)        # a new permutation each epoch, the same on every rank
        for x, y in loader: ...

Algorithm (torch/utils/data/distributed.py), N samples, n replicas, e.g. N=10, n=4::

    num_samples = ceil(N / n)                       = 3 per rank
      (drop_last and N % n != 0: ceil((N - n) / n)  = 2 per rank, the tail is dropped)
    total_size  = num_samples * n                   = 12
    indices     = permutation(N) if shuffle else 0..N-1            [7 2 9 4 0 5 1 8 3 6]
    pad         by repeating the front (cyclically if needed):     [7 2 9 4 0 5 1 8 3 6 | 7 2]
    rank r      takes indices[r : total_size : n]   rank 0: 7 0 3   rank 1: 2 5 6
                                                    rank 2: 9 1 7*  rank 3: 4 8 2*   (* padding)

The permutation comes from ``numpy.random.default_rng(seed + epoch).permutation(N)``: not
torch's generator, so the order differs from torch, but every rank computes the same one, and
the semantics (sizes, padding, striding) are torch's.

Padding makes every rank run the same number of steps (DDP needs that), at the price of seeing
``padded_size`` samples twice per epoch. For training this is harmless. For evaluation it would
count those samples twice, so use ``valid_mask()``: weight padded samples 0, then all-reduce
the sums, not the means::

    mask = sampler.valid_mask()                         # bool per local sample, in order
    loss_sum  = (per_sample_loss * mask).sum()          # and correct = ((pred == y) * mask).sum()
    count     = mask.sum()
    all_reduce([loss_sum, correct, count], SUM)         ->  mean = loss_sum / count, exact
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from minidist.logger import get_logger

log = get_logger(__name__)


def world_defaults() -> tuple[int, int]:
    """(world_size, rank) from ``minidist.comm`` when a process group is up, else (1, 0).

    Raises:
        RuntimeError: no process group, but a launcher (mpiexec, torchrun, ...) started this
            process as one of several ranks: with (1, 0) every rank would read every sample.
            torch raises here too ("Default process group has not been initialized").
    """
    try:
        from minidist import comm  # lazy: data must import without a process group
    except ImportError:
        return 1, 0
    if comm.is_initialized():
        return int(comm.get_world_size()), int(comm.get_rank())
    try:
        launch = comm.detect_launch()
    except ValueError:  # malformed launcher variables: init_process_group reports them
        return 1, 0
    if launch.world_size is not None and launch.world_size > 1:
        raise RuntimeError(
            f"[rank {launch.rank}/{launch.world_size}] DistributedSampler: this process was "
            f"launched as rank {launch.rank} of {launch.world_size} ({launch.launcher}), but no "
            "process group is initialized, so every rank would read the whole dataset. Call "
            "minidist.comm.init_process_group() first, or pass num_replicas= and rank=.")
    return 1, 0


class DistributedSampler:
    """Hands each rank a disjoint (up to padding) slice of a per-epoch permutation of the dataset.

    Args:
        dataset_or_length: a dataset (anything with ``len()``) or the number of samples.
        num_replicas: world size; default from ``minidist.comm`` (1 in a single process
            without a process group; an error in a multi-rank launch without one).
        rank: this process's rank; default from ``minidist.comm`` (0 without one).
        shuffle: permute with seed + epoch (else keep 0..N-1 order).
        seed: base seed; must be the same on every rank.
        drop_last: drop the tail so no rank gets padding (else pad by repeating the front).

    Raises:
        ValueError: num_replicas < 1 or rank outside [0, num_replicas - 1].
        RuntimeError: num_replicas or rank left to the default under a multi-rank launcher
            (mpiexec, torchrun, SLURM) before ``init_process_group`` (see ``world_defaults``).
    """

    def __init__(self, dataset_or_length: Any, num_replicas: int | None = None,
                 rank: int | None = None, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False) -> None:
        if num_replicas is None or rank is None:
            world, me = world_defaults()
            num_replicas = world if num_replicas is None else num_replicas
            rank = me if rank is None else rank
        if num_replicas < 1:
            raise ValueError(f"DistributedSampler: num_replicas={num_replicas} must be >= 1.")
        if rank >= num_replicas or rank < 0:
            raise ValueError(
                f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]")
        length = dataset_or_length if isinstance(dataset_or_length, (int, np.integer)) \
            else len(dataset_or_length)
        self.length = int(length)
        self.num_replicas, self.rank = int(num_replicas), int(rank)
        self.shuffle, self.seed, self.drop_last = bool(shuffle), int(seed), bool(drop_last)
        self.epoch = 0
        if self.drop_last and self.length % self.num_replicas != 0:
            self.num_samples = math.ceil((self.length - self.num_replicas) / self.num_replicas)
        else:
            self.num_samples = math.ceil(self.length / self.num_replicas)
        log.debug("%r", self)

    @property
    def total_size(self) -> int:
        """Samples over all ranks per epoch: ``num_samples * num_replicas``."""
        return self.num_samples * self.num_replicas

    @property
    def local_size(self) -> int:
        """Samples this rank reads per epoch (the same on every rank)."""
        return self.num_samples

    @property
    def padded_size(self) -> int:
        """Duplicated samples added over all ranks (0 with drop_last or when n divides N)."""
        return max(self.total_size - self.length, 0)

    def set_epoch(self, epoch: int) -> None:
        """Select the permutation of ``epoch`` (call before each epoch, the same value on every
        rank)."""
        self.epoch = int(epoch)

    def global_indices(self) -> np.ndarray:
        """All ``total_size`` indices of this epoch, padded or truncated, before striding."""
        if self.shuffle:
            indices = np.random.default_rng(self.seed + self.epoch).permutation(self.length)
        else:
            indices = np.arange(self.length)
        if self.total_size > self.length:
            # indices += indices[:padding], repeated while padding > N: a cyclic resize.
            return np.resize(indices, self.total_size) if self.length else indices
        return indices[: self.total_size]

    def local_indices(self) -> np.ndarray:
        """This rank's indices for the current epoch, as an int64 array (``indices[rank::n]``)."""
        return self.global_indices()[self.rank: self.total_size: self.num_replicas].astype(np.int64)

    def valid_mask(self) -> np.ndarray:
        """True for each local sample that is real, False for padding (see the module docstring).

        Padding sits at positions >= N of the padded list, whatever the permutation, so the mask
        depends only on (N, num_replicas, rank, drop_last), not on the epoch.
        """
        positions = np.arange(self.rank, self.total_size, self.num_replicas)
        return positions < self.length

    def state_dict(self) -> dict[str, Any]:
        """What fixes this rank's order: ``{"epoch", "seed", "shuffle", "num_replicas",
        "length", "drop_last"}`` (the position inside an epoch is the DataLoader's)."""
        return {"epoch": self.epoch, "seed": self.seed, "shuffle": self.shuffle,
                "num_replicas": self.num_replicas, "length": self.length,
                "drop_last": self.drop_last}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at ``state["epoch"]``; the rest must match this sampler.

        Raises:
            ValueError: the state was saved by a sampler with another seed, shuffle, world
                size, dataset length or drop_last (the order would differ).
        """
        mine = self.state_dict()
        diff = [k for k in mine if k != "epoch" and k in state and state[k] != mine[k]]
        if diff:
            raise ValueError(f"DistributedSampler.load_state_dict: saved {diff[0]}="
                             f"{state[diff[0]]!r} but this sampler has {mine[diff[0]]!r}. Build "
                             "the sampler as in the saved run (same world size, dataset, seed).")
        self.set_epoch(int(state["epoch"]))

    def __iter__(self) -> Iterator[int]:
        return iter(self.local_indices().tolist())

    def __len__(self) -> int:
        return self.num_samples

    def __repr__(self) -> str:
        return (f"DistributedSampler(N={self.length}, rank={self.rank}/{self.num_replicas}, "
                f"local_size={self.local_size}, padded={self.padded_size}, shuffle={self.shuffle}, "
                f"seed={self.seed}, epoch={self.epoch}, drop_last={self.drop_last})")
