"""The numba.cuda kernels of mixed precision, and which Numba compiles them.

``minidist.kernels.cuda`` launches these (through its launch plans); nothing else should.

**Grid-stride loop, unrolled by four.** Any grid covers any length; each thread keeps four
loads in flight (all four are loaded before any is stored), so the memory system always has
work queued:

    T = blocks * threads_per_block;  thread t loads i, i+T, i+2T, i+3T, then stores them,
    then i += 4T;  the tail (fewer than 4T elements left) one element per trip

    i:      0 .. T-1 | T .. 2T-1 | 2T .. 3T-1 | 3T .. 4T-1 | 4T ...   (each row coalesced)
    thread: 0 .. T-1 | 0 .. T-1  | 0 .. T-1   | 0 .. T-1   | 0 ...

The grid is sized from the SM count (``BLOCKS_PER_SM`` blocks of ``THREADS_PER_BLOCK`` per SM,
fewer when n is small); under the simulator it stays tiny (every simulated thread is a Python
thread). Each element is widened to fp32 (the float16 *operators*, not ``cuda.fp16``
intrinsics, which the simulator lacks), checked, multiplied, stored; a thread that saw a
NaN/inf stores ``found_inf[0] = 1.0`` once at its end (a benign race: every writer stores 1).

**Which Numba.** ``MINIDIST_CUDA_JIT=auto`` (default) uses numba-cuda (``from numba import
cuda``), or numba-cuda-mlir (``from numba_cuda_mlir import cuda``) when numba-cuda is not
installed; ``numba-cuda`` / ``numba-cuda-mlir`` choose one. The element logic is
``reference.unscale_element`` / ``reference.update_scale_rule``, compiled here with
``cuda.jit(device=True)``; ``@cuda.jit`` has no signature on purpose (an eager signature
compiles at import and raises ``CudaSupportError`` without a driver).
"""

from __future__ import annotations

from typing import Any, no_type_check

import numpy as np

from minidist.envvars import env
from minidist.kernels import reference
from minidist.kernels.cuda_buffers import cupy_module


def _import_cuda() -> tuple[Any, str]:
    choice = env("MINIDIST_CUDA_JIT")  # a bad value: one line naming it (envvars.py)
    if choice == "numba-cuda-mlir":
        from numba_cuda_mlir import cuda as mlir_cuda
        return mlir_cuda, "numba-cuda-mlir"
    try:
        from numba import cuda as numba_cuda
    except ImportError:
        if choice == "numba-cuda":
            raise
        from numba_cuda_mlir import cuda as mlir_cuda
        return mlir_cuda, "numba-cuda-mlir"
    return numba_cuda, "numba-cuda"


cuda, JIT = _import_cuda()
"""The ``cuda`` module kernels are compiled with, and which package it came from."""


def _simulator() -> bool:
    if JIT != "numba-cuda":
        return False
    from numba import config as numba_config
    return bool(getattr(numba_config, "ENABLE_CUDASIM", 0))


SIMULATOR = _simulator()
"""True when Numba's CUDA simulator is on: kernels run as Python threads on NumPy arrays."""

_unscale_element = cuda.jit(device=True)(reference.unscale_element)
_update_scale_rule = cuda.jit(device=True)(reference.update_scale_rule)


# ----------------------------------------------------------------- kernels
# (no_type_check: these bodies are typed by Numba, not by mypy's view of numba's stubs)

@cuda.jit(device=True)
@no_type_check
def _unscale_span(src, dst, inv_scale, found_inf, start, stride):
    """Grid-stride over one buffer, four loads in flight; the flag once at the end."""
    n = src.size
    i = start
    bad = False
    while i + 3 * stride < n:
        a = np.float32(src[i])  # fp32 opmath, as ATen
        b = np.float32(src[i + stride])
        c = np.float32(src[i + 2 * stride])
        d = np.float32(src[i + 3 * stride])
        va, ba = _unscale_element(a, inv_scale)
        vb, bb = _unscale_element(b, inv_scale)
        vc, bc = _unscale_element(c, inv_scale)
        vd, bd = _unscale_element(d, inv_scale)
        dst[i] = va
        dst[i + stride] = vb
        dst[i + 2 * stride] = vc
        dst[i + 3 * stride] = vd
        bad = bad or ba or bb or bc or bd
        i += 4 * stride
    while i < n:
        v, bv = _unscale_element(np.float32(src[i]), inv_scale)
        dst[i] = v
        bad = bad or bv
        i += stride
    if bad:
        found_inf[0] = np.float32(1.0)


@cuda.jit
@no_type_check
def unscale_kernel(src, dst, inv_scale, found_inf):
    """inv_scale: a float32 scalar (a kernel argument, passed by value)."""
    _unscale_span(src, dst, inv_scale, found_inf, cuda.grid(1), cuda.gridsize(1))


@cuda.jit
@no_type_check
def unscale_kernel_device_inv(src, dst, inv_scale, found_inf):
    """inv_scale: a float32[1] array already on the device (no host round trip)."""
    _unscale_span(src, dst, inv_scale[0], found_inf, cuda.grid(1), cuda.gridsize(1))


@cuda.jit
@no_type_check
def foreach_unscale_kernel(srcs, dsts, count, inv_scale, found_inf):
    """The first ``count`` pairs of the tuples srcs/dsts (padded to a fixed length, so one
    compiled kernel serves any count up to it), one after the other with the whole grid."""
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for k in range(count):
        _unscale_span(srcs[k], dsts[k], inv_scale, found_inf, start, stride)


@cuda.jit
@no_type_check
def foreach_unscale_kernel_device_inv(srcs, dsts, count, inv_scale, found_inf):
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for k in range(count):
        _unscale_span(srcs[k], dsts[k], inv_scale[0], found_inf, start, stride)


@cuda.jit
@no_type_check
def to_half_kernel(master, model):
    """model = float16(master) (cvt.rn.f16.f32: round to nearest even), four in flight."""
    n = master.size
    stride = cuda.gridsize(1)
    i = cuda.grid(1)
    while i + 3 * stride < n:
        a = master[i]
        b = master[i + stride]
        c = master[i + 2 * stride]
        d = master[i + 3 * stride]
        model[i] = np.float16(a)
        model[i + stride] = np.float16(b)
        model[i + 2 * stride] = np.float16(c)
        model[i + 3 * stride] = np.float16(d)
        i += 4 * stride
    while i < n:
        model[i] = np.float16(master[i])
        i += stride


@cuda.jit
@no_type_check
def update_scale_kernel(scale, growth_tracker, found_inf, growth_factor, backoff_factor,
                         growth_interval):
    if cuda.grid(1) == 0:  # launched with one thread; the guard keeps a bigger grid correct
        found = np.float32(0.0)
        for k in range(found_inf.size):  # any flag set (NaN != 0 counts), then reset it
            if found_inf[k] != 0.0:
                found = np.float32(1.0)
            found_inf[k] = np.float32(0.0)
        new_scale, new_tracker = _update_scale_rule(scale[0], growth_tracker[0], found,
                                                    growth_factor, backoff_factor,
                                                    growth_interval)
        scale[0] = new_scale
        growth_tracker[0] = new_tracker


# ----------------------------------------------------------------- usable here?
def _numba_cuda_version() -> str:
    """"numba-cuda 0.30.4", or numba's own version for its built-in CUDA target."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"numba-cuda {version('numba-cuda')}"
    except PackageNotFoundError:
        import numba
        return f"numba {numba.__version__} (its built-in CUDA target)"


def check_usable() -> None:
    """Raise unless kernels can run on CuPy arrays here (a real GPU, not the simulator)."""
    if SIMULATOR:
        raise RuntimeError("Numba's CUDA simulator is on (NUMBA_ENABLE_CUDASIM=1); it runs "
                           "kernels on NumPy arrays only")
    if JIT == "numba-cuda" and not hasattr(np, "row_stack"):
        raise RuntimeError(
            f"{_numba_cuda_version()} cannot compile kernels under NumPy "
            f"{np.__version__}: it uses np.row_stack, which NumPy 2.5 removed. Install "
            "'numpy<2.5' (pip install 'minidist[gpu-cu12]' or [gpu-cu13] pins it), or "
            "numba-cuda-mlir instead ([gpu-mlir-cu12] / [gpu-mlir-cu13]; docs/amp.md)")
    if cupy_module is None:
        raise RuntimeError("CuPy is not installed")
    if not cuda.is_available():
        raise RuntimeError(f"{JIT} finds no usable GPU or driver (cuda.is_available() is "
                           "False)")
