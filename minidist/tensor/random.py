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
from typing import Any

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


class Generator(numpy.random.Generator):
    """torch's ``Generator``: a random generator of its own, seeded apart from ``manual_seed``.

        g = minidist.Generator().manual_seed(0)
        perm = minidist.randperm(10, generator=g)
        loader = DataLoader(data, shuffle=True, generator=g)

    It IS a ``numpy.random.Generator`` (PCG64), so whatever takes one (``random_split``,
    ``multinomial``) takes it too. The same seed draws other numbers than torch's generator.

    Args:
        device: torch's argument; the draws are made on the host whatever it says.
    """

    def __init__(self, device: Any = "cpu") -> None:
        self._initial_seed = _fresh_seed()
        super().__init__(numpy.random.PCG64(self._initial_seed))
        self.device = device

    def manual_seed(self, seed: int) -> Generator:
        """Reseed in place; returns self (``g = Generator().manual_seed(0)``)."""
        if int(seed) < 0:
            raise ValueError(f"Generator.manual_seed: seed must be >= 0, got {seed}.")
        self._initial_seed = int(seed)
        self.bit_generator.state = numpy.random.PCG64(self._initial_seed).state
        return self

    def initial_seed(self) -> int:
        return self._initial_seed

    def seed(self) -> int:
        """Reseed from the OS's random source; returns the new seed."""
        self.manual_seed(_fresh_seed())
        return self._initial_seed

    def get_state(self) -> dict:
        """The generator's state (``set_state`` takes it back)."""
        return dict(self.bit_generator.state)

    def set_state(self, state: dict) -> Generator:
        self.bit_generator.state = state
        return self


def host_generator(generator: Any = None) -> numpy.random.Generator:
    """``generator`` (a ``Generator`` or ``numpy.random.Generator``), or the ``manual_seed`` one."""
    return default_generator() if generator is None else generator
