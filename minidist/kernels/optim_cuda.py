"""numba.cuda kernels for the fused optimizer steps: the GPU twins of ``optim_cpu.py``.

    from minidist.kernels import optim_cuda       # imports numba.cuda; kernels compile lazily
    optim_cuda.adam_step(p, g, m, v, *scalars)    # CuPy arrays (NumPy under the simulator)
    optim_cuda.sgd_step(p, g, buf, lr, momentum, keep, weight_decay, nesterov, first)

One launch updates a whole flat buffer: ``minidist.optim.fused`` hands over runs of parameters
that lie back to back in memory as one array, so a model whose parameters (and gradients) live
in one flat buffer costs one launch per step, not one per tensor. Each kernel is a grid-stride
loop (thread t handles i = t, t + T, t + 2T, ...), launched on CuPy's current stream, so the
step stays in stream order with the backward that produced the gradients and nothing waits on
the host. The element logic is ``optim_math``'s, compiled with ``cuda.jit(device=True)``.

Numerics: NVVM contracts a multiply followed by an add into one fused multiply-add (rounded
once), so GPU results may differ from the CPU's in the last bit; the simulator runs the same
Python as the CPU and matches it exactly. ``@cuda.jit`` has no signature: an eager one would
compile at import and fail on a machine without a driver.
"""

from __future__ import annotations

import math
from typing import Any, no_type_check

import numpy as np
from numba import config as _numba_config
from numba import cuda

from minidist.kernels import optim_math

__all__ = ["sgd_step", "adam_step", "sgd_multi_step", "adam_multi_step", "SIMULATOR",
           "COMPILE_ERRORS", "check_usable", "signature", "rehearse", "launch_config",
           "device_view", "current_stream", "configured"]

SIMULATOR = bool(getattr(_numba_config, "ENABLE_CUDASIM", 0))
THREADS_PER_BLOCK = 256
BLOCKS_PER_SM = 8

COMPILE_ERRORS: tuple[type[BaseException], ...]
try:
    from numba.core.errors import NumbaError
    from numba.cuda.cudadrv.error import CudaSupportError, NvvmSupportError
    COMPILE_ERRORS = (NumbaError, CudaSupportError, NvvmSupportError)
except ImportError:  # pragma: no cover - module layout differs between numba and numba-cuda
    from numba.core.errors import NumbaError
    COMPILE_ERRORS = (NumbaError,)

try:
    import cupy as _cupy
except ImportError:  # pragma: no cover - depends on the machine
    _cupy = None

_sgd_element = cuda.jit(device=True)(optim_math.sgd_element)
# numba.cuda has no np.sqrt on scalars; the simulator's math.sqrt would return a Python float
_adam_element = cuda.jit(device=True)(optim_math.make_adam_element(np.sqrt if SIMULATOR
                                                                   else math.sqrt))


@cuda.jit
@no_type_check
def _sgd_kernel(p, g, buf, lr, momentum, keep, weight_decay, nesterov, first):
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, p.size, stride):
        if momentum != 0:
            new_p, new_buf = _sgd_element(p[i], g[i], buf[i], lr, momentum, keep, weight_decay,
                                          nesterov, first)
            buf[i] = new_buf
        else:
            new_p, _ = _sgd_element(p[i], g[i], p[i], lr, momentum, keep, weight_decay,
                                    nesterov, first)
        p[i] = new_p


@cuda.jit
@no_type_check
def _adam_kernel(p, g, m, v, decay, l2, beta1, one_minus_beta1, beta2, one_minus_beta2,
                 bias_correction2_sqrt, eps, step_size):
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, p.size, stride):
        new_p, new_m, new_v = _adam_element(p[i], g[i], m[i], v[i], decay, l2, beta1,
                                            one_minus_beta1, beta2, one_minus_beta2,
                                            bias_correction2_sqrt, eps, step_size)
        p[i] = new_p
        m[i] = new_m
        v[i] = new_v


# Multi-tensor kernels: every tensor of a (dtype) group in one launch. ``base`` spans them
# all; ``offsets`` is the flat (rows x W) table of minidist.optim.multi_tensor: row k holds
# tensor k's element offsets in ``base`` (W - 1 columns), then its numel. Each thread strides
# over tensor k, then over tensor k + 1, ...: coalesced within a tensor, no search.

@cuda.jit
@no_type_check
def _sgd_multi_kernel(base, offsets, lr, momentum, keep, weight_decay, nesterov, first):
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for k in range(offsets.size // 4):
        op, og, ob, n = offsets[4 * k], offsets[4 * k + 1], offsets[4 * k + 2], offsets[4 * k + 3]
        for j in range(start, n, stride):
            if momentum != 0:
                new_p, new_buf = _sgd_element(base[op + j], base[og + j], base[ob + j], lr,
                                              momentum, keep, weight_decay, nesterov, first)
                base[ob + j] = new_buf
            else:
                new_p, _ = _sgd_element(base[op + j], base[og + j], base[op + j], lr, momentum,
                                        keep, weight_decay, nesterov, first)
            base[op + j] = new_p


@cuda.jit
@no_type_check
def _adam_multi_kernel(base, offsets, decay, l2, beta1, one_minus_beta1, beta2, one_minus_beta2,
                       bias_correction2_sqrt, eps, step_size):
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for k in range(offsets.size // 5):
        op, og, om = offsets[5 * k], offsets[5 * k + 1], offsets[5 * k + 2]
        ov, n = offsets[5 * k + 3], offsets[5 * k + 4]
        for j in range(start, n, stride):
            new_p, new_m, new_v = _adam_element(base[op + j], base[og + j], base[om + j],
                                                base[ov + j], decay, l2, beta1, one_minus_beta1,
                                                beta2, one_minus_beta2, bias_correction2_sqrt,
                                                eps, step_size)
            base[op + j] = new_p
            base[om + j] = new_m
            base[ov + j] = new_v


_sm_count: int | None = None


def launch_config(n: int, launch: tuple[int, int] | None = None) -> tuple[int, int]:
    """``(blocks, threads_per_block)``: enough blocks to fill the GPU, no more than n needs
    (the simulator: at most 2 x 64, since each simulated thread is a Python thread)."""
    if launch is not None:
        return int(launch[0]), int(launch[1])
    if SIMULATOR:
        return min(2, math.ceil(n / 64)), 64
    global _sm_count
    if _sm_count is None:
        _sm_count = int(cuda.get_current_device().MULTIPROCESSOR_COUNT)
    return min(math.ceil(n / THREADS_PER_BLOCK), _sm_count * BLOCKS_PER_SM), THREADS_PER_BLOCK


def device_view(a: Any) -> Any:
    """A Numba view of a CuPy array (zero copy, no stream sync); NumPy (simulator) as it is."""
    if _cupy is not None and isinstance(a, _cupy.ndarray):
        return cuda.as_cuda_array(a, sync=False)
    return a


# Host cost per launch: Numba's launch path builds a stream object and a launch configuration
# per call unless given the same ones again (its configure cache is keyed on the Stream
# object); both are kept here, per CuPy stream handle and per (kernel, grid, stream).
_STREAMS: dict[int, Any] = {}
_CONFIGURED: dict[tuple, Any] = {}


def current_stream() -> Any:
    """CuPy's current stream as a Numba stream (0 under the simulator or without CuPy)."""
    if _cupy is None or SIMULATOR:
        return 0
    ptr = _cupy.cuda.get_current_stream().ptr
    stream = _STREAMS.get(ptr)
    if stream is None:
        if len(_STREAMS) > 64:
            _STREAMS.clear()
            _CONFIGURED.clear()
        stream = _STREAMS[ptr] = cuda.external_stream(ptr) if ptr else cuda.default_stream()
    return stream


def configured(kernel: Any, blocks: int, threads: int) -> Any:
    """``kernel[blocks, threads, current_stream()]``, built once per grid and stream."""
    stream = current_stream()
    key = (kernel, blocks, threads, id(stream))
    launcher = _CONFIGURED.get(key)
    if launcher is None:
        from minidist.kernels.cuda import configure_quietly  # small grids are on purpose

        launcher = _CONFIGURED[key] = configure_quietly(kernel, blocks, threads, stream)
    return launcher


def _launch(kernel: Any, n: int, launch: tuple[int, int] | None, *args: Any) -> None:
    blocks, threads = launch_config(n, launch)
    if blocks > 0:
        configured(kernel, blocks, threads)(*args)


signature = optim_math.signature  # the fallback's per-signature rehearsal key


def check_usable() -> None:
    """Raise unless kernels can run on CuPy arrays here (a real GPU, not the simulator)."""
    if SIMULATOR:
        raise RuntimeError("Numba's CUDA simulator is on (NUMBA_ENABLE_CUDASIM=1); it runs "
                           "kernels on NumPy arrays only")
    if _cupy is None:
        raise RuntimeError("CuPy is not installed")
    if not cuda.is_available():
        raise RuntimeError("numba.cuda finds no usable GPU or driver")


def sgd_step(p: Any, g: Any, buf: Any, lr: Any, momentum: Any, keep: Any, weight_decay: Any,
             nesterov: bool, first: bool, *, launch: tuple[int, int] | None = None) -> None:
    """One SGD step in place on 1-D device arrays, one launch (see ``optim_cpu.sgd_step``)."""
    _launch(_sgd_kernel, int(p.size), launch, device_view(p), device_view(g),
            device_view(buf), lr, momentum, keep, weight_decay, bool(nesterov), bool(first))


def adam_step(p: Any, g: Any, m: Any, v: Any, *scalars: Any,
              launch: tuple[int, int] | None = None) -> None:
    """One Adam/AdamW step in place on 1-D device arrays, one launch."""
    _launch(_adam_kernel, int(p.size), launch, device_view(p), device_view(g), device_view(m),
            device_view(v), *scalars)


def _multi_launch(kernel: Any, base: Any, offsets: Any, max_numel: int, scalars: tuple,
                  launch: tuple[int, int] | None) -> None:
    """One launch over a multi-tensor table, through a cached launch plan (its views, stream
    and configuration built once per table: minidist.kernels.cuda.LaunchPlan), with a grid
    sized for the largest tensor."""
    from minidist.kernels import cuda as kcuda

    if offsets.size == 0 or max_numel == 0:
        return
    grid = launch_config(int(max_numel), launch)
    plan = kcuda.launch_plan(kernel, (_simulated(base), offsets), int(max_numel), grid)
    plan.launch(*plan.views, *scalars)


_SIMULATED: dict[int, tuple[Any, Any]] = {}


def _simulated(base: Any) -> Any:
    """Under the simulator, ``base`` wrapped as a simulated device array: the simulator copies
    NumPy arguments in and back out, and a copy of ``base`` would read and write the memory
    between the tensors. On a GPU (CuPy) ``base`` as it is."""
    if not (SIMULATOR and isinstance(base, np.ndarray)):
        return base
    entry = _SIMULATED.get(id(base))
    if entry is None or entry[0] is not base:
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        if len(_SIMULATED) > 64:
            _SIMULATED.clear()
        entry = _SIMULATED[id(base)] = (base, FakeCUDAArray(base))
    return entry[1]


def sgd_multi_step(base: Any, offsets: Any, max_numel: int, *scalars: Any,
                   launch: tuple[int, int] | None = None) -> None:
    """One SGD step of every tensor of a multi-tensor table (rows: p, g, buf offsets and numel;
    ``minidist.optim.multi_tensor``): ONE launch. ``scalars`` as ``sgd_step``'s."""
    lr, momentum, keep, wd, nesterov, first = scalars
    _multi_launch(_sgd_multi_kernel, base, offsets, max_numel,
                  (lr, momentum, keep, wd, bool(nesterov), bool(first)), launch)


def adam_multi_step(base: Any, offsets: Any, max_numel: int, *scalars: Any,
                    launch: tuple[int, int] | None = None) -> None:
    """One Adam/AdamW step of every tensor of a multi-tensor table (p, g, m, v, numel): ONE
    launch."""
    _multi_launch(_adam_multi_kernel, base, offsets, max_numel, scalars, launch)


_MULTI_COLUMNS = {"sgd_multi_step": 3, "adam_multi_step": 4}


def rehearse(op: str, *args: Any) -> None:
    """Compile and launch ``op`` on private data (a multi-tensor op on a small private table:
    a copy of the real one would point past the copies), and wait for it."""
    from minidist.kernels.fallback import private_copies

    columns = _MULTI_COLUMNS.get(op)
    if columns is None:
        globals()[op](*private_copies(args))
    else:
        xp = np if isinstance(args[0], np.ndarray) else _cupy
        base, table = optim_math.rehearsal_table(xp, args[0].dtype, columns, 67)
        globals()[op](base, table, 67, *args[3:])
    if _cupy is not None and not SIMULATOR:
        _cupy.cuda.get_current_stream().synchronize()
