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

import collections
import contextlib
import warnings
from typing import Any, Iterator, Union

import numpy

from minidist.envvars import env, raw

try:  # CuPy is optional: the `gpu` extra.
    import cupy as _cupy
except ImportError:  # pragma: no cover - depends on the machine
    _cupy = None

Array = Union[numpy.ndarray, Any]  # numpy.ndarray or cupy.ndarray
"""Type alias for an array of either module (CuPy is not importable everywhere)."""

np = numpy  # the host module, for code that always works on the CPU (data loading, I/O)

_default_device = (raw("MINIDIST_DEVICE") or "cpu").lower()  # checked at first use


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


def gpu_count() -> int:
    """How many CUDA devices CuPy can use here (0 without CuPy or without a GPU)."""
    if not gpu_available():
        return 0
    try:
        return int(_cupy.cuda.runtime.getDeviceCount())
    except Exception:  # as gpu_available: a broken driver answers with an exception
        return 0


def require_cuda(cpu_hint: str = "MINIDIST_DEVICE=cpu") -> Any:
    """Return the cupy module, or raise a clear error that says how to get a working GPU path.

    ``cpu_hint`` is how the caller's user picks the CPU instead (a script whose ``--device
    cuda`` flag wins over the variable passes ``"--device cpu"``)."""
    if _cupy is None:
        raise DeviceUnavailableError(
            "the GPU path needs CuPy, which is not installed. Install the extra that matches your "
            "CUDA version, e.g. `pip install 'minidist[gpu]'` (cupy-cuda12x), or run on the CPU "
            f"with {cpu_hint}."
        )
    if not gpu_available():
        raise DeviceUnavailableError(
            "CuPy is installed but no usable CUDA device was found (cupy.cuda.is_available() is "
            "False: no GPU, or the driver is older than CuPy's CUDA runtime). Run on the CPU with "
            f"{cpu_hint}, or check `nvidia-smi`."
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
        env("MINIDIST_DEVICE", {"MINIDIST_DEVICE": _default_device})  # raises: says what works
    return numpy


def is_device_array(array: Any) -> bool:
    """True for a CuPy (device) array."""
    return _cupy is not None and isinstance(array, _cupy.ndarray)


def get_array_module(*arrays: Any) -> Any:
    """The module owning the given arrays: cupy if any is a CuPy array, else numpy."""
    if _cupy is not None:  # (without CuPy every array is a NumPy one)
        for a in arrays:
            if isinstance(a, _cupy.ndarray):
                return _cupy
    return numpy


# ---- host transfers: the one function every device-to-host copy goes through ----------------
#
# A device-to-host copy waits for the GPU to finish everything queued before it (a
# synchronization): inside a training step it stalls the host until the GPU drains, so the next
# kernels are queued late. minidist's forward, backward and optimizer step make none, apart
# from GradScaler.step's one read of the inf/NaN flags (torch makes the same one). Every copy
# is counted here, on the CPU too (where it costs nothing but would synchronize on a GPU), so
# a test on the CPU can check that a step makes none.

SYNC_DEBUG_MODES = {"default": 0, "warn": 1, "error": 2}
"""torch's names and numbers for ``set_sync_debug_mode``."""

_sync_debug_mode = 0
_counters: list[collections.Counter] = []


class SyncDebugError(RuntimeError):
    """An implicit synchronization under ``set_sync_debug_mode("error")``."""


def set_sync_debug_mode(debug_mode: int | str) -> None:
    """What an implicit device-to-host synchronization does (torch.cuda's function).

    ``"default"`` (0): nothing. ``"warn"`` (1): a ``UserWarning`` naming the op.
    ``"error"`` (2): ``SyncDebugError`` naming the op. An implicit synchronization is one the
    library makes for its own sake (a check, a decision on a device value); one the user asks
    for (``.item()``, ``float()``, ``.numpy()``, printing) is never flagged. The mode applies to
    NumPy arrays as well: the same call would synchronize on a GPU, so a CPU run finds it.
    """
    global _sync_debug_mode
    if isinstance(debug_mode, str):
        if debug_mode not in SYNC_DEBUG_MODES:
            raise ValueError(f"set_sync_debug_mode: unknown mode {debug_mode!r}; use one of "
                             f"{sorted(SYNC_DEBUG_MODES)} (or 0, 1, 2).")
        debug_mode = SYNC_DEBUG_MODES[debug_mode]
    if debug_mode not in (0, 1, 2):
        raise ValueError(f"set_sync_debug_mode: unknown mode {debug_mode!r}; use 0 "
                         "('default'), 1 ('warn') or 2 ('error').")
    _sync_debug_mode = int(debug_mode)


def get_sync_debug_mode() -> int:
    """The current mode as torch returns it: 0 (default), 1 (warn) or 2 (error)."""
    return _sync_debug_mode


@contextlib.contextmanager
def count_host_transfers() -> Iterator[collections.Counter]:
    """Count the device-to-host transfers made inside the block, by op.

        with count_host_transfers() as counts:
            loss = model(x).sum(); loss.backward(); opt.step()
        counts   # Counter(): none; counts["item"] after a loss.item()

    Keys are the op names of implicit transfers (``"GradScaler.step"``) and ``"item"``,
    ``"numpy"``, ... for those the user asked for. NumPy arrays are counted too.
    """
    counts: collections.Counter = collections.Counter()
    _counters.append(counts)
    try:
        yield counts
    finally:
        _counters.remove(counts)


def to_host(array: Any, *, op: str | None = None, explicit: str = "to_host") -> numpy.ndarray:
    """A NumPy copy (or the array itself, if it already is one) of a NumPy or CuPy array.

    Args:
        array: a NumPy or CuPy array.
        op: the library operation that needs the values on the host: an IMPLICIT
            synchronization, flagged under ``set_sync_debug_mode("warn" | "error")``. None
            when the user asked for the values (``explicit`` names how).
        explicit: the user-facing call (``"item"``, ``"numpy"``, ...) when ``op`` is None.

    Raises:
        SyncDebugError: ``op`` is given and the sync debug mode is ``"error"``.
    """
    if _counters:
        for counts in _counters:
            counts[op or explicit] += 1
    if op is not None and _sync_debug_mode:
        msg = (f"{op}: an implicit device-to-host synchronization (it copies a value to the "
               "host and waits for the GPU). Keep the value on the device, or call "
               "set_sync_debug_mode('default') to allow it.")
        if _sync_debug_mode == 2:
            raise SyncDebugError(msg)
        warnings.warn(msg, UserWarning, stacklevel=3)
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


# ---- torch-style devices --------------------------------------------------------------------


class device:  # noqa: N801 - torch's name
    """Where an array lives, spelled as torch does: ``device("cpu")``, ``device("cuda:1")``.

        device("cuda:1")           # device(type='cuda', index=1)
        device("cuda", 0)          # the same as device("cuda:0")
        device(device("cpu"))      # a device is accepted wherever a device string is

    Creating a ``cuda`` device never touches the GPU; moving an array to it does (and raises
    ``DeviceUnavailableError`` on a machine without CuPy or a GPU).

    Args:
        type: ``"cpu"``, ``"cuda"``, ``"cuda:N"``, or another ``device``.
        index: the GPU number (``cuda`` only; None means the current device).
    """

    __slots__ = ("type", "index")

    def __init__(self, type: Any, index: int | None = None) -> None:  # noqa: A002 - torch's name
        if isinstance(type, device):
            type, index = type.type, type.index if index is None else index
        if isinstance(type, int) and not isinstance(type, bool):  # torch: device(1) is cuda:1
            type, index = "cuda", type
        if not isinstance(type, str):
            raise TypeError(f"device: expected a string like 'cpu' or 'cuda:0', got "
                            f"{type!r} ({builtin_type(type).__name__}).")
        text = type.strip().lower()
        if ":" in text:
            text, _, num = text.partition(":")
            if index is not None or not num.isdigit():
                raise ValueError(f"device: cannot parse {type!r}; write 'cpu', 'cuda' or "
                                 "'cuda:N' with N a GPU number.")
            index = int(num)
        if text not in ("cpu", "cuda"):
            raise ValueError(f"device: unknown device type {text!r} in {type!r}; use 'cpu' "
                             "(NumPy) or 'cuda' (CuPy).")
        if text == "cpu" and index not in (None, 0):
            raise ValueError(f"device: 'cpu' has no index {index}; use 'cpu'.")
        self.type, self.index = text, (None if text == "cpu" else index)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            other = device(other)
        return isinstance(other, device) and (self.type, self.index) == (other.type, other.index)

    def __hash__(self) -> int:
        return hash((self.type, self.index))

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __repr__(self) -> str:
        idx = "" if self.index is None else f", index={self.index}"
        return f"device(type={self.type!r}{idx})"


builtin_type = type


def device_of(array: Any) -> device:
    """The ``device`` holding ``array`` (``cuda:N`` for a CuPy array, else ``cpu``)."""
    if is_device_array(array):
        return device("cuda", int(array.device.id))
    return device("cpu")


def move(array: Any, where: Any) -> Any:
    """``array`` on device ``where`` (a ``device`` or its string); no copy if already there.

    Raises:
        DeviceUnavailableError: ``where`` is a CUDA device and CuPy or a GPU is missing.
    """
    where = device(where)
    if where.type == "cpu":
        return to_host(array)
    cupy = require_cuda()
    index = where.index if where.index is not None else cupy.cuda.Device().id
    if is_device_array(array) and array.device.id == index:
        return array
    with cupy.cuda.Device(index):
        return cupy.asarray(array)
