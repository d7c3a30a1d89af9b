"""``minidist.accelerator``: torch.accelerator's device-agnostic queries, answered for CUDA.

    import minidist
    device = minidist.accelerator.current_accelerator() if minidist.accelerator.is_available() \\
        else minidist.device("cpu")

minidist's only accelerator is a CUDA GPU through CuPy. Without CuPy or a GPU,
``current_accelerator()`` is None, ``is_available()`` False and ``device_count()`` 0, and the
calls that need a device (``current_device_index``, ``set_device_index``, ``synchronize``)
raise ``RuntimeError``, as torch's do on a CPU-only build.
"""

from __future__ import annotations

from typing import Any

from minidist import cuda
from minidist import xp as backend


def _require(op: str) -> None:
    if not cuda.is_available():
        raise RuntimeError(f"accelerator.{op}: cannot access an accelerator device when none is "
                           "available (minidist's accelerator is a CUDA GPU through CuPy).")


def current_accelerator(check_available: bool = False) -> backend.device | None:
    """``device(type='cuda')`` when a GPU is usable, else None (``check_available`` as torch:
    both ways the answer is None without a usable GPU)."""
    del check_available
    return backend.device("cuda") if cuda.is_available() else None


def is_available() -> bool:
    """True when a CUDA GPU is usable (CuPy installed and a device present)."""
    return cuda.is_available()


def device_count() -> int:
    """The number of usable GPUs (0 without one)."""
    return cuda.device_count()


def current_device_index() -> int:
    """The index of the current GPU.

    Raises:
        RuntimeError: no accelerator.
    """
    _require("current_device_index")
    return cuda.current_device()


def set_device_index(device: Any, /) -> None:
    """Make GPU ``device`` (an int, ``"cuda:N"`` or a ``minidist.device``) the current one.

    Raises:
        RuntimeError: no accelerator.
    """
    _require("set_device_index")
    cuda.set_device(device)


def synchronize(device: Any = None, /) -> None:
    """Wait for the queued work on the current GPU.

    Raises:
        RuntimeError: no accelerator.
    """
    _require("synchronize")
    cuda.synchronize()


current_device_idx = current_device_index  # torch's older (deprecated) spellings
set_device_idx = set_device_index

__all__ = ["current_accelerator", "is_available", "device_count", "current_device_index",
           "set_device_index", "synchronize", "current_device_idx", "set_device_idx"]
