"""numba.cuda kernels for the fused optimizer steps: the GPU twins of ``optim_cpu.py``.

    from minidist.kernels import optim_cuda       # imports numba.cuda; kernels compile lazily
    optim_cuda.flat_step(entry, p, g, (m, v), scalars)   # CuPy arrays (NumPy under the simulator)
    optim_cuda.multi_step(entry, base, offsets, max_numel, scalars)

``entry`` is a ``minidist.optim.registry.FusedStep``; its two kernels are built on first use
from ``entry.element`` (compiled with ``cuda.jit(device=True)``) and cached. One launch updates
a whole flat buffer: ``minidist.optim.fused`` hands over runs of parameters that lie back to
back in memory as one array, so a model whose parameters (and gradients) live in one flat
buffer costs one launch per step, not one per tensor. Each kernel is a grid-stride loop
(thread t handles i = t, t + T, t + 2T, ...), launched on CuPy's current stream, so the step
stays in stream order with the backward that produced the gradients and nothing waits on the
host.

Numerics: NVVM contracts a multiply followed by an add into one fused multiply-add (rounded
once), so GPU results may differ from the CPU's in the last bit; the simulator runs the same
Python as the CPU and matches it exactly. ``@cuda.jit`` has no signature: an eager one would
compile at import and fail on a machine without a driver.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, no_type_check

import numpy as np
from numba import config as _numba_config
from numba import cuda

from minidist.kernels import optim_math

__all__ = ["flat_step", "multi_step", "kernels_for", "SIMULATOR",
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

if not SIMULATOR:  # the simulator runs np.sqrt as it is
    from numba.extending import overload

    @overload(optim_math.sqrt, target="cuda", inline="always")
    def _sqrt(x: Any) -> Any:
        def impl(x: Any) -> Any:
            return math.sqrt(x)  # numba.cuda has no np.sqrt on scalars
        return impl


class Kernels(NamedTuple):
    """An entry's kernels: ``flat(p, g, states, scalars)`` over one flat run and
    ``multi(base, offsets, scalars)`` over a multi-tensor table."""

    flat: Any
    multi: Any


def _build_kernels(entry: Any) -> Kernels:
    element = cuda.jit(device=True)(entry.element)
    update = cuda.jit(device=True)(optim_math.make_update(element, len(entry.state)))
    columns = cuda.jit(device=True)(optim_math.make_columns(len(entry.state)))
    width = 3 + len(entry.state)  # a table row: p, g, the state arrays, numel

    @no_type_check
    def flat(p, g, states, scalars):
        start, stride = cuda.grid(1), cuda.gridsize(1)
        for i in range(start, p.size, stride):
            update(i, p, g, states, scalars)

    # ``offsets`` is the flat (rows x W) table of minidist.optim.multi_tensor: row k holds
    # tensor k's element offsets in ``base`` (W - 1 columns: p, g, the state arrays), then its
    # numel. Each thread strides over tensor k, then over tensor k + 1, ...: coalesced within
    # a tensor, no search.
    @no_type_check
    def multi(base, offsets, scalars):
        start, stride = cuda.grid(1), cuda.gridsize(1)
        for k in range(offsets.size // width):
            row = offsets[width * k:width * (k + 1)]
            n = row[width - 1]
            p, g, states = columns(base, row, n)
            for j in range(start, n, stride):
                update(j, p, g, states, scalars)

    # the launch plans of minidist.kernels.cuda are keyed by the kernel's name: one per entry
    flat.__name__ = flat.__qualname__ = f"fused_{entry.name}_{id(entry):x}_flat"
    multi.__name__ = multi.__qualname__ = f"fused_{entry.name}_{id(entry):x}_multi"
    return Kernels(cuda.jit(flat), cuda.jit(multi))


_KERNELS: dict[Any, Kernels] = {}


def kernels_for(entry: Any) -> Kernels:
    """``entry``'s kernels, built once (Numba compiles them at the first launch)."""
    kernels = _KERNELS.get(entry)
    if kernels is None:
        kernels = _KERNELS[entry] = _build_kernels(entry)
    return kernels


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


def flat_step(entry: Any, p: Any, g: Any, states: tuple[Any, ...], scalars: tuple[Any, ...],
              *, launch: tuple[int, int] | None = None) -> None:
    """One step of ``entry`` in place on one flat run of device arrays: one launch (see
    ``optim_cpu.flat_step``)."""
    _launch(kernels_for(entry).flat, int(p.size), launch, device_view(p), device_view(g),
            tuple(device_view(a) for a in states), scalars)


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


def multi_step(entry: Any, base: Any, offsets: Any, max_numel: int, scalars: tuple[Any, ...],
               *, launch: tuple[int, int] | None = None) -> None:
    """One step of ``entry`` for every tensor of a multi-tensor table (rows: offsets of p, g
    and each state array, then the numel; ``minidist.optim.multi_tensor``): ONE launch."""
    _multi_launch(kernels_for(entry).multi, base, offsets.reshape(-1), max_numel, (scalars,),
                  launch)


def rehearse(op: str, entry: Any, *args: Any) -> None:
    """Compile and launch ``op`` on private data (a multi-tensor op on a small private table:
    a copy of the real one would point past the copies), and wait for it."""
    from minidist.kernels.fallback import private_copies

    if op == "flat_step":
        flat_step(entry, *private_copies(args))
    else:
        xp = np if isinstance(args[0], np.ndarray) else _cupy
        base, table = optim_math.rehearsal_table(xp, args[0].dtype, 2 + len(entry.state), 67)
        multi_step(entry, base, table, 67, args[3])
    if _cupy is not None and not SIMULATOR:
        _cupy.cuda.get_current_stream().synchronize()
