"""``torch.backends.cudnn``: ``enabled``, ``benchmark``, ``deterministic``, ``allow_tf32``;
stored and without effect (minidist has no cuDNN; see ``minidist.backends``).

    import minidist.backends.cudnn as cudnn
    cudnn.benchmark = True
"""

from __future__ import annotations

enabled = True
benchmark = False
deterministic = False
allow_tf32 = True  # torch's default for convolutions


def is_available() -> bool:
    """False: there is no cuDNN here."""
    return False


def version() -> None:
    """None, as torch answers without cuDNN."""
    return None


__all__ = ["enabled", "benchmark", "deterministic", "allow_tf32", "is_available", "version"]
