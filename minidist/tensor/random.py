"""The random generator behind weight init and dropout, seeded by ``manual_seed``.

    import minidist
    minidist.manual_seed(0)                 # same seed -> same weights on every rank
    model = build_model()
    minidist.initial_seed()                 # 0

Weights are drawn on the host from ``numpy.random.default_rng(seed)`` and then moved to the
default device, so the same seed gives the same weights on CPU and GPU.

Without ``manual_seed``, each process seeds itself from the operating system's random source
at import, as torch does: ``initial_seed()`` differs per process and per run, and so do the
draws. DDP broadcasts rank 0's parameters and buffers at construction, so ranks still start
from the same model; anything else that must agree across ranks (a ``random_split`` without a
seed, dropout masks one wants reproducible) needs a ``manual_seed``, as in torch.
"""

from __future__ import annotations

import os

import numpy

from minidist import xp as backend


def _fresh_seed() -> int:
    """A 64-bit seed from the OS's random source (torch seeds its default generator so)."""
    return int.from_bytes(os.urandom(8), "little")


_seed = _fresh_seed()
_generator = numpy.random.default_rng(_seed)


def manual_seed(seed: int) -> numpy.random.Generator:
    """Reseed the generator used by ``nn`` init and dropout (and CuPy's, when a GPU is there).

    Args:
        seed: any non-negative int; the same seed reproduces the same sequence of draws.

    Returns:
        The new ``numpy.random.Generator``.
    """
    global _generator, _seed
    if int(seed) < 0:
        raise ValueError(f"manual_seed: seed must be >= 0, got {seed}. Pass a non-negative int.")
    _seed = int(seed)
    _generator = numpy.random.default_rng(_seed)
    if backend.gpu_available():  # pragma: no cover - needs a GPU
        backend.require_cuda().random.seed(int(seed))
    return _generator


def default_generator() -> numpy.random.Generator:
    """The current host generator (replaced by each ``manual_seed`` call)."""
    return _generator


def initial_seed() -> int:
    """The seed of the current generator: the last ``manual_seed``, or the random one drawn at
    import (torch's ``initial_seed``)."""
    return _seed


def seed() -> int:
    """Reseed from the OS's random source and return the new seed (torch's ``seed``)."""
    new = _fresh_seed()
    manual_seed(new)
    return new
