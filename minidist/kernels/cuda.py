"""numba.cuda kernels for mixed precision: the GPU twins of ``cpu.py``, on CuPy's stream.

    from minidist.kernels import cuda as kcuda      # imports numba.cuda; kernels compile lazily
    found = kcuda.unscale_and_check(grads16, master32, 1 / 65536)    # CuPy arrays in
    kcuda.update_scale_(scale, tracker, found_inf, 2.0, 0.5, 2000)   # 1 thread, no host sync

Arguments are checked by ``minidist.kernels`` before they get here; call these through it
unless you have validated them yourself. Under Numba's simulator (``NUMBA_ENABLE_CUDASIM=1`` set
before numba is imported) the same functions run on NumPy arrays, which is how CI tests them.

Every elementwise kernel is a grid-stride loop, so any grid covers any length:

    T = blocks * threads_per_block threads;  thread t handles i = t, t + T, t + 2T, ... < n

    i:      0    1   ...  T-1 |  T   T+1  ...  2T-1 |  2T ...  n-1
    thread: 0    1   ...  T-1 |  0    1   ...  T-1  |  0   ...

A full GPU needs a few blocks per SM (``_launch_config``); the tests use 2 x 64 threads and n
not a multiple of 128, so the ragged tail runs too. Each element is read once: widen to fp32
(``np.float32(h)``: the float16 *operators*, not ``cuda.fp16`` intrinsics, which the simulator
lacks), check the input, multiply, store. Any thread that sees a NaN/inf stores
``found_inf[0] = 1.0``: a benign race, every writer stores the same value (as ATen does).

The element logic is ``reference.unscale_element`` / ``reference.update_scale_rule``, compiled
here with ``cuda.jit(device=True)``. ``@cuda.jit`` has no signature on purpose: an eager
signature compiles at import and raises ``CudaSupportError`` on a machine without a driver.

CuPy arrays are wrapped with ``cuda.as_cuda_array(a, sync=False)`` (a zero-copy view) and every
launch goes on CuPy's current stream (``cuda.external_stream``), so kernels stay in CuPy's order
and nothing waits on the host; with ``sync=True`` Numba would block on the array's stream.
"""

from __future__ import annotations

import math
from typing import Any, no_type_check

import numpy as np
from numba import config as _numba_config
from numba import cuda

from minidist.kernels import reference

__all__ = ["unscale_and_check", "unscale_and_check_", "update_scale_", "master_to_model",
           "SIMULATOR", "COMPILE_ERRORS", "check_usable"]

SIMULATOR = bool(getattr(_numba_config, "ENABLE_CUDASIM", 0))
"""True when Numba's CUDA simulator is on: kernels run as Python threads on NumPy arrays."""

THREADS_PER_BLOCK = 256
BLOCKS_PER_SM = 8  # 8 x 256 = 2048 resident threads per SM on Volta..Hopper: a full GPU

COMPILE_ERRORS: tuple[type[BaseException], ...]
"""Errors that mean "this machine cannot build/launch CUDA kernels" (the caller falls back)."""
try:
    from numba.core.errors import NumbaError
    from numba.cuda.cudadrv.error import CudaSupportError, NvvmSupportError
    COMPILE_ERRORS = (NumbaError, CudaSupportError, NvvmSupportError)
except ImportError:  # pragma: no cover - module layout differs between numba and numba-cuda
    from numba.core.errors import NumbaError
    COMPILE_ERRORS = (NumbaError,)

try:  # CuPy is optional: without it only the simulator (NumPy arrays) can use this module
    import cupy as _cupy
except ImportError:  # pragma: no cover - depends on the machine
    _cupy = None

_unscale_element = cuda.jit(device=True)(reference.unscale_element)
_update_scale_rule = cuda.jit(device=True)(reference.update_scale_rule)


# ----------------------------------------------------------------- kernels
# (no_type_check: these bodies are typed by Numba, not by mypy's view of numba's stubs)

@cuda.jit(device=True)
@no_type_check
def _unscale_range(src: Any, dst: Any, inv_scale: Any, found_inf: Any) -> None:
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, src.size, stride):
        value, bad = _unscale_element(np.float32(src[i]), inv_scale)  # fp32 opmath
        dst[i] = value
        if bad:
            found_inf[0] = np.float32(1.0)


@cuda.jit
def _unscale_kernel(src: Any, dst: Any, inv_scale: Any, found_inf: Any) -> None:
    """inv_scale: a float32 scalar (a kernel argument, passed by value)."""
    _unscale_range(src, dst, inv_scale, found_inf)


@cuda.jit
def _unscale_kernel_device_inv(src: Any, dst: Any, inv_scale: Any, found_inf: Any) -> None:
    """inv_scale: a float32[1] array already on the device (no host round trip)."""
    _unscale_range(src, dst, inv_scale[0], found_inf)


@cuda.jit
@no_type_check
def _to_half_kernel(master: Any, model: Any) -> None:
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, master.size, stride):
        model[i] = np.float16(master[i])  # cvt.rn.f16.f32: round to nearest even


@cuda.jit
@no_type_check
def _update_scale_kernel(scale: Any, growth_tracker: Any, found_inf: Any, growth_factor: float,
                         backoff_factor: float, growth_interval: int) -> None:
    if cuda.grid(1) == 0:  # launched with one thread; the guard keeps a bigger grid correct
        new_scale, new_tracker = _update_scale_rule(scale[0], growth_tracker[0], found_inf[0],
                                                    growth_factor, backoff_factor,
                                                    growth_interval)
        scale[0] = new_scale
        growth_tracker[0] = new_tracker


# ----------------------------------------------------------------- launching

_sm_count: int | None = None


def _launch_config(n: int, launch: tuple[int, int] | None) -> tuple[int, int]:
    """``(blocks, threads_per_block)``: enough blocks to fill the GPU, no more than n needs."""
    if launch is not None:
        return int(launch[0]), int(launch[1])
    if SIMULATOR:  # every simulated thread is a Python thread: keep the grid tiny
        return min(2, math.ceil(n / 64)), 64
    global _sm_count
    if _sm_count is None:
        _sm_count = int(cuda.get_current_device().MULTIPROCESSOR_COUNT)
    return min(math.ceil(n / THREADS_PER_BLOCK), _sm_count * BLOCKS_PER_SM), THREADS_PER_BLOCK


def _is_cupy(a: Any) -> bool:
    return _cupy is not None and isinstance(a, _cupy.ndarray)


def _device_view(a: Any) -> Any:
    """A Numba view of a CuPy array (zero copy, no stream sync); anything else as it is."""
    if _is_cupy(a):
        return cuda.as_cuda_array(a.reshape(-1), sync=False)
    if isinstance(a, np.ndarray):
        return a.reshape(-1)
    return a  # a Numba device array (or the simulator's fake one)


def _stream() -> Any:
    """CuPy's current stream as a Numba stream (0 = the legacy default stream), or 0."""
    if _cupy is None or SIMULATOR:
        return 0
    ptr = _cupy.cuda.get_current_stream().ptr
    return cuda.external_stream(ptr) if ptr else cuda.default_stream()


def _launch(kernel: Any, n: int, launch: tuple[int, int] | None, *args: Any) -> None:
    blocks, threads = _launch_config(n, launch)
    if blocks > 0:
        kernel[blocks, threads, _stream()](*args)


def _is_host_number(x: Any) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating))


# ----------------------------------------------------------------- entry points

def check_usable() -> None:
    """Raise unless kernels can run on CuPy arrays here (a real GPU, not the simulator)."""
    if SIMULATOR:
        raise RuntimeError("Numba's CUDA simulator is on (NUMBA_ENABLE_CUDASIM=1); it runs "
                           "kernels on NumPy arrays only")
    if _cupy is None:
        raise RuntimeError("CuPy is not installed")
    if not cuda.is_available():
        raise RuntimeError("numba.cuda finds no usable GPU or driver (cuda.is_available() is "
                           "False)")


def unscale_and_check_(src: Any, dst: Any, inv_scale: Any, found_inf: Any, *,
                       launch: tuple[int, int] | None = None) -> None:
    """``dst = float32(src) * inv_scale``; ``found_inf[0] = 1.0`` if src has a NaN/inf.

    Nothing is copied to or from the host: ``inv_scale`` may be a host number (passed by value)
    or a float32[1] device array, and ``found_inf`` (float32[1], zeroed by the caller) stays on
    the device.

    Args:
        src: float32 or float16 CuPy array (NumPy under the simulator), C-contiguous.
        dst: float32 array with as many elements; may be ``src`` (float32).
        inv_scale: 1 / scale: a number, or a 1-element float32 device array.
        found_inf: float32[1] on the device; set to 1.0 on a NaN/inf, never zeroed here.
        launch: ``(blocks, threads_per_block)``; default: fill the GPU (simulator: 2 x 64).
    """
    n = int(src.size)
    if n == 0:
        return
    s, d, f = _device_view(src), _device_view(dst), _device_view(found_inf)
    if _is_host_number(inv_scale):
        _launch(_unscale_kernel, n, launch, s, d, np.float32(inv_scale), f)
    elif isinstance(inv_scale, np.ndarray):  # a host array: its value, by value
        _launch(_unscale_kernel, n, launch, s, d, np.float32(inv_scale.reshape(-1)[0]), f)
    else:
        _launch(_unscale_kernel_device_inv, n, launch, s, d, _device_view(inv_scale), f)


def unscale_and_check(src: Any, dst: Any, inv_scale: Any, *,
                      launch: tuple[int, int] | None = None) -> bool:
    """:func:`unscale_and_check_` with a fresh flag, read back: this one syncs the stream."""
    if _is_cupy(src):
        found = _cupy.zeros(1, dtype=np.float32)
        unscale_and_check_(src, dst, inv_scale, found, launch=launch)
        return bool(float(found.get()[0]) != 0.0)
    found_host = np.zeros(1, dtype=np.float32)  # the simulator (or Numba-managed host arrays)
    unscale_and_check_(src, dst, inv_scale, found_host, launch=launch)
    return bool(found_host[0] != 0.0)


def update_scale_(scale: Any, growth_tracker: Any, found_inf: Any, growth_factor: float,
                  backoff_factor: float, growth_interval: int) -> None:
    """torch's ``_amp_update_scale_`` as a one-thread kernel: scale and tracker stay on the GPU."""
    _launch(_update_scale_kernel, 1, (1, 1), _device_view(scale), _device_view(growth_tracker),
            _device_view(found_inf), float(growth_factor), float(backoff_factor),
            int(growth_interval))


def master_to_model(master: Any, model: Any, *, launch: tuple[int, int] | None = None) -> None:
    """``model[...] = master.astype(float16)`` (round to nearest even), one pass on the GPU."""
    if master.size:
        _launch(_to_half_kernel, int(master.size), launch, _device_view(master),
                _device_view(model))
