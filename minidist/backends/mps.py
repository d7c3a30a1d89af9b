"""``torch.backends.mps``: Apple's GPU backend does not exist here."""

from __future__ import annotations


def is_available() -> bool:
    """False: minidist runs on NumPy (CPU) or CuPy (CUDA) only."""
    return False


def is_built() -> bool:
    """False."""
    return False


__all__ = ["is_available", "is_built"]
