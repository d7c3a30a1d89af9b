"""``minidist.cuda``: torch.cuda's device queries, answered through CuPy.

    import minidist
    dev = minidist.device("cuda" if minidist.cuda.is_available() else "cpu")
    model.to(dev)

``manual_seed``/``manual_seed_all`` seed CuPy's own generator (minidist's draws come from the
host generator of ``minidist.manual_seed``).

``set_sync_debug_mode("warn")`` (or ``"error"``) flags every implicit device-to-host
synchronization the library makes, naming the op, as torch's does; a training step makes
none apart from ``GradScaler.step``'s read of its inf/NaN flags (docs/gpu.md)::

    minidist.cuda.set_sync_debug_mode("error")    # raise at the first implicit sync
    minidist.cuda.get_sync_debug_mode()           # 2

On a machine without CuPy or a GPU, ``is_available()`` is False and ``device_count()`` is 0;
``set_device``/``current_device`` raise the one-line ``DeviceUnavailableError`` that says how to
get a working GPU path (minidist.xp.require_cuda).
"""

from __future__ import annotations

from typing import Any

from minidist import xp as backend

DeviceUnavailableError = backend.DeviceUnavailableError
SyncDebugError = backend.SyncDebugError


def set_sync_debug_mode(debug_mode: int | str) -> None:
    """torch.cuda's switch: ``"default"`` (0), ``"warn"`` (1) or ``"error"`` (2) on every
    implicit device-to-host synchronization (``minidist.xp.set_sync_debug_mode``)."""
    backend.set_sync_debug_mode(debug_mode)


def get_sync_debug_mode() -> int:
    """The sync debug mode: 0 (default), 1 (warn) or 2 (error)."""
    return backend.get_sync_debug_mode()


def is_available() -> bool:
    """True when CuPy is installed and at least one CUDA device can be used."""
    return backend.gpu_available()


def device_count() -> int:
    """The number of usable CUDA devices (0 without CuPy or a GPU)."""
    if not backend.gpu_available():
        return 0
    return int(backend.require_cuda().cuda.runtime.getDeviceCount())


def set_device(device: Any) -> None:
    """Make GPU ``device`` (an int, ``"cuda:N"`` or ``minidist.device``) the current one.

    Typical use, one GPU per rank: ``minidist.cuda.set_device(minidist.get_local_rank())``.
    """
    dev = backend.device(device)
    if dev.type != "cuda":
        raise ValueError(f"set_device: expected a CUDA device, got {str(dev)!r}. Pass a GPU "
                         "number or 'cuda:N'.")
    cupy = backend.require_cuda()
    index = 0 if dev.index is None else dev.index
    if not 0 <= index < device_count():
        raise ValueError(f"set_device: GPU {index} does not exist; this machine has "
                         f"{device_count()} (valid: 0..{device_count() - 1}).")
    cupy.cuda.Device(index).use()


def current_device() -> int:
    """The index of the current GPU."""
    return int(backend.require_cuda().cuda.Device().id)


def synchronize() -> None:
    """Wait for all queued work on the current GPU (a no-op without one)."""
    backend.synchronize()


def manual_seed(seed: int) -> None:
    """Seed CuPy's generator on the current GPU; silently ignored without one, as torch's.

    minidist draws its own random numbers (weights, dropout, ``randn``) on the host from the
    generator ``minidist.manual_seed`` seeds, for every device, so call that to make them
    reproducible; this one reaches only CuPy code you call yourself.
    """
    if backend.gpu_available():  # pragma: no cover - needs a GPU
        backend.require_cuda().random.seed(int(seed))


def manual_seed_all(seed: int) -> None:
    """``manual_seed`` on every GPU (each rank drives one GPU here: the same call)."""
    manual_seed(seed)


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """False: minidist computes bfloat16 only on the CPU (CuPy has no bfloat16 arrays), so a
    script's ``"bfloat16" if cuda.is_bf16_supported() else "float16"`` picks float16, which
    runs on a GPU here; without a GPU torch answers False too."""
    return False


def _memory_pool() -> Any:
    return backend.require_cuda().get_default_memory_pool() if backend.gpu_available() else None


def memory_allocated(device: Any = None) -> int:
    """Bytes of GPU memory held by arrays now (CuPy's memory pool); 0 without a GPU, as torch."""
    pool = _memory_pool()
    return 0 if pool is None else int(pool.used_bytes())


def memory_reserved(device: Any = None) -> int:
    """Bytes the memory pool holds from the GPU (used and cached); 0 without a GPU."""
    pool = _memory_pool()
    return 0 if pool is None else int(pool.total_bytes())


_peak = {"allocated": 0, "reserved": 0}


def max_memory_allocated(device: Any = None) -> int:
    """The most ``memory_allocated`` seen by this function, ``memory_allocated`` itself or
    ``reset_peak_memory_stats`` (CuPy keeps no peak of its own, so short peaks between two
    such calls are missed; torch's allocator records every one); 0 without a GPU."""
    _peak["allocated"] = max(_peak["allocated"], memory_allocated(device))
    return _peak["allocated"]


def max_memory_reserved(device: Any = None) -> int:
    """As ``max_memory_allocated``, for ``memory_reserved``; 0 without a GPU."""
    _peak["reserved"] = max(_peak["reserved"], memory_reserved(device))
    return _peak["reserved"]


def reset_peak_memory_stats(device: Any = None) -> None:
    """Start the peaks again from the current values."""
    _peak["allocated"], _peak["reserved"] = memory_allocated(device), memory_reserved(device)


def empty_cache() -> None:
    """Give the memory pool's cached blocks back to the GPU (a no-op without one, as torch)."""
    pool = _memory_pool()
    if pool is not None:  # pragma: no cover - needs a GPU
        pool.free_all_blocks()
