"""The random generator behind weight init and dropout, seeded by ``manual_seed``.

    import minidist
    minidist.manual_seed(0)                 # same seed -> same weights on every rank
    model = build_model()

Weights are drawn on the host from ``numpy.random.default_rng(seed)`` and then moved to the
default device, so the same seed gives the same weights on CPU and GPU.
"""

from __future__ import annotations

import numpy

from minidist import xp as backend

_generator = numpy.random.default_rng(0)


def manual_seed(seed: int) -> numpy.random.Generator:
    """Reseed the generator used by ``nn`` init and dropout (and CuPy's, when a GPU is there).

    Args:
        seed: any non-negative int; the same seed reproduces the same sequence of draws.

    Returns:
        The new ``numpy.random.Generator``.
    """
    global _generator
    if int(seed) < 0:
        raise ValueError(f"manual_seed: seed must be >= 0, got {seed}. Pass a non-negative int.")
    _generator = numpy.random.default_rng(int(seed))
    if backend.gpu_available():  # pragma: no cover - needs a GPU
        backend.require_cuda().random.seed(int(seed))
    return _generator


def default_generator() -> numpy.random.Generator:
    """The current host generator (replaced by each ``manual_seed`` call)."""
    return _generator
