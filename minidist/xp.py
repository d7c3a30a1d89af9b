"""Array-module selection: NumPy on the CPU, CuPy on a GPU, chosen in one place.

Every other module asks this one for its array module instead of importing numpy or cupy by
name where the array module matters::

    from minidist import xp as backend
    xp = backend.get_array_module(array)     # numpy or cupy, whichever owns `array`
    host = backend.to_host(array)            # always a numpy.ndarray

The default array module for new tensors is NumPy. ``set_default_device("cuda")`` (or the
environment variable ``MINIDIST_DEVICE=cuda``) switches it to CuPy, and fails with a message
that says what is missing when CuPy or a GPU is not there. ``import cupy`` succeeding proves
nothing about a GPU (it imports fine on a CPU-only machine), so the two cases are told apart:
a missing wheel (ImportError) and a missing device (``cupy.cuda.is_available()`` is False).
"""

from __future__ import annotations

import os
from typing import Any, Union

import numpy

try:  # CuPy is optional: the `gpu` extra.
    import cupy as _cupy
except ImportError:  # pragma: no cover - depends on the machine
    _cupy = None

Array = Union[numpy.ndarray, Any]  # numpy.ndarray or cupy.ndarray
"""Type alias for an array of either module (CuPy is not importable everywhere)."""

np = numpy  # the host module, for code that always works on the CPU (data loading, I/O)

_default_device = os.environ.get("MINIDIST_DEVICE", "cpu").lower()


class DeviceUnavailableError(RuntimeError):
    """The GPU path was asked for but CuPy or a CUDA device is missing."""


def gpu_available() -> bool:
    """True when CuPy is installed and at least one CUDA device can be used."""
    if _cupy is None:
        return False
    try:
        return bool(_cupy.cuda.is_available())
    except Exception:  # a broken driver install raises instead of answering False
        return False


def require_cuda() -> Any:
    """Return the cupy module, or raise a clear error that says how to get a working GPU path."""
    if _cupy is None:
        raise DeviceUnavailableError(
            "the GPU path needs CuPy, which is not installed. Install the extra that matches your "
            "CUDA version, e.g. `pip install 'minidist[gpu]'` (cupy-cuda12x), or run on the CPU "
            "with MINIDIST_DEVICE=cpu."
        )
    if not gpu_available():
        raise DeviceUnavailableError(
            "CuPy is installed but no usable CUDA device was found (cupy.cuda.is_available() is "
            "False: no GPU, or the driver is older than CuPy's CUDA runtime). Run on the CPU with "
            "MINIDIST_DEVICE=cpu, or check `nvidia-smi`."
        )
    return _cupy


def set_default_device(device: str) -> None:
    """Choose where new arrays live: ``"cpu"`` (NumPy) or ``"cuda"`` (CuPy)."""
    global _default_device
    device = device.lower()
    if device not in ("cpu", "cuda"):
        raise ValueError(f"set_default_device: unknown device {device!r}; use 'cpu' or 'cuda'.")
    if device == "cuda":
        require_cuda()
    _default_device = device


def default_device() -> str:
    """The device new arrays are created on: ``"cpu"`` or ``"cuda"``."""
    return _default_device


def default_array_module() -> Any:
    """The array module for new arrays (numpy unless the default device is ``"cuda"``)."""
    if _default_device == "cuda":
        return require_cuda()
    if _default_device != "cpu":  # only reachable through the environment variable
        raise ValueError(f"MINIDIST_DEVICE={_default_device!r} is not a device minidist knows; "
                         "set it to 'cpu' (NumPy) or 'cuda' (CuPy), or unset it.")
    return numpy


def is_device_array(array: Any) -> bool:
    """True for a CuPy (device) array."""
    return _cupy is not None and isinstance(array, _cupy.ndarray)


def get_array_module(*arrays: Any) -> Any:
    """The module owning the given arrays: cupy if any is a CuPy array, else numpy."""
    for a in arrays:
        if is_device_array(a):
            return _cupy
    return numpy


def to_host(array: Any) -> numpy.ndarray:
    """A NumPy copy (or the array itself, if it already is one) of a NumPy or CuPy array."""
    if is_device_array(array):
        return _cupy.asnumpy(array)
    return numpy.asarray(array)


def to_device(array: Any, device: str | None = None) -> Any:
    """Move a host array to ``device`` (default: the default device); a no-op on the CPU."""
    device = (device or _default_device).lower()
    if device == "cuda":
        return require_cuda().asarray(array)
    return to_host(array)


def synchronize(array: Any = None) -> None:
    """Wait for queued GPU work (the current stream) before a buffer goes to MPI; CPU: no-op."""
    if _cupy is not None and (array is None or is_device_array(array)) and gpu_available():
        _cupy.cuda.get_current_stream().synchronize()
