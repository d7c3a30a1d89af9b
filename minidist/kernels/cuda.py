"""numba.cuda kernels for mixed precision: the GPU twins of ``cpu.py``, on CuPy's stream.

    from minidist.kernels import cuda as kcuda      # imports numba.cuda; kernels compile lazily
    found = kcuda.unscale_and_check(grads16, master32, 1 / 65536)    # CuPy arrays in
    kcuda.update_scale_(scale, tracker, found_inf, 2.0, 0.5, 2000)   # 1 thread, no host sync

Arguments are checked by ``minidist.kernels`` before they get here; call these through it
unless you have validated them yourself. Under Numba's simulator (``NUMBA_ENABLE_CUDASIM=1`` set
before numba is imported) the same functions run on NumPy arrays, which is how CI tests them.

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

**Launch plans.** What a launch needs besides the data is built once per persistent buffer
and reused, so the host cost of a call is a dictionary lookup and the launch itself:

    plan key = (kernel, (ptr, size, dtype) of each array, CuPy stream, grid)
    plan     = Numba views of the arrays (no owner, no stream sync)
             + the Numba stream wrapping the CuPy stream (one per CuPy stream, cached)
             + the configured launch object ``kernel[blocks, threads, stream]``
             + after its first launch: the compiled kernel the dispatcher chose
               (``overloads``) and its array arguments packed once (``PackedLaunch``): later
               launches pack only the scalars and call cuda.core's ``launch``, skipping the
               dispatcher's typing and packing

A view records only a pointer, a size and a dtype, so a plan is valid for whatever array
holds that memory now: a buffer freed and reallocated at the same address with the same size
and dtype is the same plan, anything else is a new one. Persistent buffers (DDP buckets,
``MasterWeights``' flat buffers, the scaler's scale/tracker/flags) hit the cache every step.
Temporary arrays work too, on the slower path: a new address builds a plan (the view, the
configuration: benchmarks/gpu_check.py times it); the caches keep the ``PLAN_CACHE_SIZE`` most
recent plans.
``MINIDIST_CUDA_LAUNCH=dispatcher`` launches through Numba's dispatcher every time (to compare).

**Which Numba.** ``MINIDIST_CUDA_JIT=auto`` (default) uses numba-cuda (``from numba import
cuda``), or numba-cuda-mlir (``from numba_cuda_mlir import cuda``) when numba-cuda is not
installed; ``numba-cuda`` / ``numba-cuda-mlir`` choose one. The element logic is
``reference.unscale_element`` / ``reference.update_scale_rule``, compiled here with
``cuda.jit(device=True)``; ``@cuda.jit`` has no signature on purpose (an eager signature
compiles at import and raises ``CudaSupportError`` without a driver).
"""

from __future__ import annotations

import collections
import math
import sys
import threading
import warnings
from typing import Any, Hashable, NamedTuple, no_type_check

import numpy as np

from minidist.envvars import env
from minidist.kernels import reference
from minidist.kernels.fallback import default_signature, private_copies


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

__all__ = ["unscale_and_check", "unscale_and_check_", "foreach_unscale_and_check_",
           "update_scale_", "master_to_model", "SIMULATOR", "JIT", "check_usable", "signature",
           "rehearse", "PLAN_STATS", "clear_plans", "configure_quietly", "launch_plan"]


def _simulator() -> bool:
    if JIT != "numba-cuda":
        return False
    from numba import config as numba_config
    return bool(getattr(numba_config, "ENABLE_CUDASIM", 0))


SIMULATOR = _simulator()
"""True when Numba's CUDA simulator is on: kernels run as Python threads on NumPy arrays."""

THREADS_PER_BLOCK = 256
BLOCKS_PER_SM = 8      # 8 x 256 = 2048 resident threads per SM on Volta..Hopper: a full GPU
UNROLL = 4             # loads in flight per thread (the kernels are written out for 4)
MAX_BUFFERS_PER_LAUNCH = 16
"""Buffer pairs one multi-buffer launch takes (kernel parameters: ~56 bytes per array)."""
PLAN_CACHE_SIZE = 512
FAST_LAUNCH = env("MINIDIST_CUDA_LAUNCH") != "dispatcher"

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
def _unscale_kernel(src, dst, inv_scale, found_inf):
    """inv_scale: a float32 scalar (a kernel argument, passed by value)."""
    _unscale_span(src, dst, inv_scale, found_inf, cuda.grid(1), cuda.gridsize(1))


@cuda.jit
@no_type_check
def _unscale_kernel_device_inv(src, dst, inv_scale, found_inf):
    """inv_scale: a float32[1] array already on the device (no host round trip)."""
    _unscale_span(src, dst, inv_scale[0], found_inf, cuda.grid(1), cuda.gridsize(1))


@cuda.jit
@no_type_check
def _foreach_unscale_kernel(srcs, dsts, count, inv_scale, found_inf):
    """The first ``count`` pairs of the tuples srcs/dsts (padded to a fixed length, so one
    compiled kernel serves any count up to it), one after the other with the whole grid."""
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for k in range(count):
        _unscale_span(srcs[k], dsts[k], inv_scale, found_inf, start, stride)


@cuda.jit
@no_type_check
def _foreach_unscale_kernel_device_inv(srcs, dsts, count, inv_scale, found_inf):
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for k in range(count):
        _unscale_span(srcs[k], dsts[k], inv_scale[0], found_inf, start, stride)


@cuda.jit
@no_type_check
def _to_half_kernel(master, model):
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
def _update_scale_kernel(scale, growth_tracker, found_inf, growth_factor, backoff_factor,
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


# ----------------------------------------------------------------- launch plans

class PlanStats:
    """Counters of the plan caches (tests check that a second call builds nothing)."""

    def __init__(self) -> None:
        self.plans_built = 0
        self.views_built = 0
        self.streams_built = 0
        self.launches = 0
        self.direct_launches = 0
        self.packed_launches = 0

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


PLAN_STATS = PlanStats()
_VIEWS: collections.OrderedDict[Hashable, Any] = collections.OrderedDict()
_PLANS: collections.OrderedDict[Hashable, LaunchPlan] = collections.OrderedDict()
_FOREACH: collections.OrderedDict[Hashable, list] = collections.OrderedDict()
_STREAMS: dict[int, Any] = {}
_sm_count: int | None = None


def clear_plans() -> None:
    """Forget every cached view, plan and stream (tests; after a device reset)."""
    _VIEWS.clear()
    _PLANS.clear()
    _FOREACH.clear()
    _STREAMS.clear()


def _remember(cache: collections.OrderedDict, key: Hashable, value: Any) -> Any:
    cache[key] = value
    if len(cache) > PLAN_CACHE_SIZE:
        cache.popitem(last=False)
    return value


def _is_cupy(a: Any) -> bool:
    return _cupy is not None and isinstance(a, _cupy.ndarray)


def _array_key(a: Any) -> Hashable:
    """What a view depends on: address, length, dtype (and the GPU)."""
    if _is_cupy(a):
        return (a.data.ptr, a.size, a.dtype.char, a.data.device_id)
    if isinstance(a, np.ndarray):
        return (a.ctypes.data, a.size, a.dtype.char, -1)
    return ("obj", id(a))  # a Numba device array: used as it is


def _view(a: Any, key: Hashable) -> Any:
    """The Numba view of ``a`` (flat), built once per (address, size, dtype)."""
    view = _VIEWS.get(key)
    if view is None:
        PLAN_STATS.views_built += 1
        if _is_cupy(a):  # no owner: the plan must not keep a freed buffer alive
            view = cuda.from_cuda_array_interface(a.reshape(-1).__cuda_array_interface__,
                                                  owner=None, sync=False)
        elif isinstance(a, np.ndarray):
            view = a.reshape(-1)
        else:
            view = a
        _remember(_VIEWS, key, view)
    else:
        try:
            _VIEWS.move_to_end(key)  # recently used: evicted last
        except KeyError:  # another thread (DDP's comm thread) evicted it meanwhile
            pass
    return view


def _stream_ptr() -> int:
    if _cupy is None or SIMULATOR:
        return 0
    return int(_cupy.cuda.get_current_stream().ptr)


def _numba_stream(ptr: int) -> Any:
    """One Numba stream per CuPy stream (0 = the legacy default stream)."""
    stream = _STREAMS.get(ptr)
    if stream is None:
        PLAN_STATS.streams_built += 1
        if SIMULATOR:
            stream = 0
        else:
            stream = cuda.external_stream(ptr) if ptr else cuda.default_stream()
        _STREAMS[ptr] = stream
    return stream


def _launch_config(n: int, launch: tuple[int, int] | None) -> tuple[int, int]:
    """``(blocks, threads_per_block)``: enough blocks to fill the GPU, no more than n needs
    (each thread handles ``UNROLL`` elements per trip)."""
    if launch is not None:
        return int(launch[0]), int(launch[1])
    if SIMULATOR:  # every simulated thread is a Python thread: keep the grid tiny
        return min(2, math.ceil(n / 64)), 64
    global _sm_count
    if _sm_count is None:
        _sm_count = int(cuda.get_current_device().MULTIPROCESSOR_COUNT)
    blocks = math.ceil(n / (THREADS_PER_BLOCK * UNROLL))
    return min(blocks, _sm_count * BLOCKS_PER_SM), THREADS_PER_BLOCK


def _is_scalar(value: Any) -> bool:
    return isinstance(value, (bool, int, float, np.number))


class PackedLaunch:
    """A compiled kernel's handle with its array arguments packed ONCE, by the compiled
    kernel's own ``_prepare_args`` (so the bytes are what Numba's launch would pass); per call
    only the scalars are packed, then the launch goes straight to ``cuda.core``'s ``launch``.

    Built only where Numba exposes exactly that (numba-cuda 0.30: ``launch`` and
    ``LaunchConfig`` in the compiled kernel's module, no debug, no extensions, not
    cooperative); anything else raises here and the plan keeps the compiled kernel's
    ``launch``.
    """

    def __init__(self, compiled: Any, args: tuple[Any, ...], griddim: Any, blockdim: Any,
                 stream: Any) -> None:
        import sys

        module = sys.modules[type(compiled).__module__]
        if compiled.debug or compiled.extensions or getattr(compiled, "cooperative", False):
            raise TypeError("debug, extensions or cooperative launches are packed per call")
        self.launch_fn, self.compiled, self.stream = module.launch, compiled, stream
        self.kernel = compiled._codelibrary.get_cufunc().kernel
        self.config = module.LaunchConfig(grid=griddim, block=blockdim, shmem_size=0)
        self.types = tuple(compiled.argument_types)
        self.fixed = args
        self.parts: list[list | None] = []
        for ty, value in zip(self.types, args):
            if _is_scalar(value):
                self.parts.append(None)  # packed at every call
                continue
            packed: list[Any] = []
            written_back: list[Any] = []
            compiled._prepare_args(ty, value, stream, written_back, packed)
            if written_back:  # a host array would need a copy back: not a fixed argument
                raise TypeError("argument needs a copy back")
            self.parts.append(packed)

    def __call__(self, args: tuple[Any, ...]) -> bool:
        """Launch; False (nothing launched) when an array argument is not the packed one."""
        kernelargs: list[Any] = []
        for part, ty, value, fixed in zip(self.parts, self.types, args, self.fixed):
            if part is None:
                self.compiled._prepare_args(ty, value, self.stream, [], kernelargs)
            elif value is fixed or (type(value) is tuple and len(value) == len(fixed)
                                    and all(a is b for a, b in zip(value, fixed))):
                kernelargs.extend(part)
            else:
                return False
        self.launch_fn(self.stream, self.config, self.kernel, *kernelargs)
        return True


class LaunchPlan:
    """One kernel on fixed arrays, grid and stream: ``plan.launch(*args)`` runs it.

    The first launch goes through Numba's dispatcher (it compiles, types the arguments); the
    plan then keeps what the dispatcher chose: the compiled kernel (``direct``: skips typing)
    and, where possible, its pre-packed arguments (``packed``: skips packing the arrays).
    """

    __slots__ = ("kernel", "views", "launcher", "direct", "packed", "griddim", "blockdim",
                 "stream")

    def __init__(self, kernel: Any, views: tuple[Any, ...], blocks: int, threads: int,
                 stream: Any) -> None:
        PLAN_STATS.plans_built += 1
        self.kernel, self.views, self.stream = kernel, views, stream
        self.launcher = configure_quietly(kernel, blocks, threads, stream)
        # as the dispatcher launches it: normalized dimensions, its own stream object
        self.griddim = getattr(self.launcher, "griddim", None)
        self.blockdim = getattr(self.launcher, "blockdim", None)
        self.stream = getattr(self.launcher, "stream", stream)
        self.direct: Any = None
        self.packed: PackedLaunch | None = None

    def launch(self, *args: Any) -> None:
        global FAST_LAUNCH
        PLAN_STATS.launches += 1
        if not FAST_LAUNCH:  # MINIDIST_CUDA_LAUNCH=dispatcher, or switched off at run time
            self.launcher(*args)
            return
        if self.packed is not None:
            try:
                if self.packed(args):
                    PLAN_STATS.packed_launches += 1
                    return
            except (TypeError, AttributeError):  # rejected before launching: not packable
                self.packed = None
        if self.direct is not None:
            try:
                self.direct.launch(args, self.griddim, self.blockdim, self.stream, 0)
                PLAN_STATS.direct_launches += 1
                return
            except (TypeError, AttributeError):  # another Numba's internals: not launched
                FAST_LAUNCH, self.direct = False, None
        self.launcher(*args)
        if not SIMULATOR:
            self.direct = self._compiled_kernel(args)
            if self.direct is not None:
                try:
                    self.packed = PackedLaunch(self.direct, args, self.griddim, self.blockdim,
                                               self.stream)
                except (TypeError, AttributeError, KeyError):  # another Numba's internals
                    self.packed = None

    def _compiled_kernel(self, args: tuple[Any, ...]) -> Any:
        """The compiled kernel the dispatcher just chose for these argument types (so later
        launches skip typing the arguments), or None where Numba does not expose it."""
        overloads = getattr(self.kernel, "overloads", None)
        typeof = getattr(self.kernel, "typeof_pyval", None)
        if overloads is None or typeof is None or self.griddim is None:
            return None
        compiled = overloads.get(tuple(typeof(a) for a in args))
        return compiled if hasattr(compiled, "launch") else None


_CONFIGURE_LOCK = threading.Lock()


def configure_quietly(kernel: Any, blocks: int, threads: int, stream: Any) -> Any:
    """``kernel[blocks, threads, stream]`` without Numba's low-occupancy warning.

    Numba decides that warning once per configuration, when ``kernel[...]`` is built, from
    ``config.CUDA_LOW_OCCUPANCY_WARNINGS`` of its dispatcher's module (grids under 128 blocks
    warn). Small grids are chosen here (one thread updates the loss scale; a small buffer
    needs few blocks), so the flag is off while THIS configuration is built and restored
    right after: the user's own launches still warn. A Numba that decides it elsewhere is
    covered by a warnings filter around the configuration as well.
    """
    config: Any = getattr(sys.modules.get(type(kernel).__module__), "config", None)
    flag: Any = getattr(config, "CUDA_LOW_OCCUPANCY_WARNINGS", 0) if config is not None else 0
    with _CONFIGURE_LOCK, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Grid size \d+ will likely result in GPU "
                                "under-utilization")
        if flag:
            config.CUDA_LOW_OCCUPANCY_WARNINGS = 0
        try:
            return kernel[blocks, threads, stream]
        finally:
            if flag:
                config.CUDA_LOW_OCCUPANCY_WARNINGS = flag


def launch_plan(kernel: Any, arrays: tuple[Any, ...], n: int,
                launch: tuple[int, int] | None = None) -> LaunchPlan:
    """The cached ``LaunchPlan`` of ``kernel`` over ``arrays`` (CuPy, or NumPy under the
    simulator) with a grid for ``n`` elements: ``plan.launch(*plan.views, *scalars)``."""
    return _plan(kernel, arrays, n, launch)


def _plan(kernel: Any, arrays: tuple[Any, ...], n: int,
          launch: tuple[int, int] | None) -> LaunchPlan:
    keys = tuple(_array_key(a) for a in arrays)
    return _plan_for(kernel, keys, lambda: arrays, n, launch)


def _plan_for(kernel: Any, keys: tuple[Hashable, ...], make_arrays: Any, n: int,
              launch: tuple[int, int] | None) -> LaunchPlan:
    """The plan for arrays with these keys; ``make_arrays()`` is called only to build one."""
    ptr = _stream_ptr()
    key = (kernel.__name__ if hasattr(kernel, "__name__") else id(kernel), keys, ptr, n, launch)
    plan = _PLANS.get(key)
    if plan is not None:
        return plan
    blocks, threads = _launch_config(n, launch)
    views = tuple(_view(a, k) for a, k in zip(make_arrays(), keys))
    return _remember(_PLANS, key, LaunchPlan(kernel, views, blocks, threads,
                                             _numba_stream(ptr)))


def _is_host_number(x: Any) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating))


def _host_inv(inv_scale: Any) -> Any:
    """inv_scale as a float32 scalar, or None when it is a device array (passed as is)."""
    if _is_host_number(inv_scale):
        return np.float32(inv_scale)
    if isinstance(inv_scale, np.ndarray):  # a host array: its value, by value
        return np.float32(inv_scale.reshape(-1)[0])
    return None


# ----------------------------------------------------------------- entry points

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
    if _cupy is None:
        raise RuntimeError("CuPy is not installed")
    if not cuda.is_available():
        raise RuntimeError(f"{JIT} finds no usable GPU or driver (cuda.is_available() is "
                           "False)")


def signature(op: str, *args: Any) -> Hashable:
    """What selects compiled code: op, dtypes, aliasing (``fallback.default_signature``)."""
    return default_signature(op, args)


def rehearse(op: str, *args: Any) -> None:
    """Compile and launch ``op`` twice (the dispatcher, then the direct launch) on small
    private copies, and wait for it: errors surface here, before caller data is touched."""
    copies = private_copies(args)
    fn = globals()[op]
    for _ in range(2):
        fn(*copies)
    if _cupy is not None and not SIMULATOR:
        _cupy.cuda.get_current_stream().synchronize()


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
    inv = _host_inv(inv_scale)
    if inv is not None:
        plan = _plan(_unscale_kernel, (src, dst, found_inf), n, launch)
        s, d, f = plan.views
        plan.launch(s, d, inv, f)
    else:
        plan = _plan(_unscale_kernel_device_inv, (src, dst, found_inf, inv_scale), n, launch)
        s, d, f, i = plan.views
        plan.launch(s, d, i, f)


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


def _root(a: np.ndarray) -> np.ndarray:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _follows(a: Any, b: Any) -> bool:
    """Does b start where a ends, same dtype, in one allocation (views of one flat buffer)?"""
    if a.dtype != b.dtype:
        return False
    if _is_cupy(a):
        return a.data.mem is b.data.mem and a.data.ptr + a.nbytes == b.data.ptr
    root = _root(a)
    return (_root(b) is root and root.flags.c_contiguous
            and a.ctypes.data + a.nbytes == b.ctypes.data)


def _joined(pieces: list[Any], n: int) -> Any:
    """One flat array over consecutive pieces of one allocation (checked by ``_follows``)."""
    first = pieces[0]
    if len(pieces) == 1:
        return first.reshape(-1)
    if _is_cupy(first):
        return _cupy.ndarray((n,), first.dtype, memptr=first.data)
    root = _root(first)
    return np.ndarray((n,), first.dtype, buffer=root, offset=first.ctypes.data - root.ctypes.data)


class _Run(NamedTuple):
    """srcs[first..last] (and dsts), consecutive pieces of one buffer: one flat pair."""
    first: int
    last: int
    numel: int
    in_place: bool
    dtype: str


def _layout(srcs: list, dsts: list) -> list[list[_Run]]:
    """Runs of joinable pairs, grouped by src dtype, at most MAX_BUFFERS_PER_LAUNCH a group.
    Only indices and sizes: a cached layout keeps no array alive."""
    runs: list[_Run] = []
    for i, (src, dst) in enumerate(zip(srcs, dsts)):
        if src.size == 0:
            continue
        in_place = src is dst
        if runs:
            r = runs[-1]
            if (r.in_place == in_place and _follows(srcs[r.last], src)
                    and (in_place or _follows(dsts[r.last], dst))):
                runs[-1] = r._replace(last=i, numel=r.numel + int(src.size))
                continue
        runs.append(_Run(i, i, int(src.size), in_place, src.dtype.char))
    by_dtype: dict[str, list[_Run]] = {}
    for r in runs:
        by_dtype.setdefault(r.dtype, []).append(r)
    return [rs[k:k + MAX_BUFFERS_PER_LAUNCH] for rs in by_dtype.values()
            for k in range(0, len(rs), MAX_BUFFERS_PER_LAUNCH)]


def _run_keys(arrays: list, runs: list[_Run]) -> tuple[Hashable, ...]:
    """The view key of each run's joined array: its first piece's address, the run's length."""
    out = []
    for r in runs:
        k = _array_key(arrays[r.first])
        out.append((k[0], r.numel, k[2], k[3]) if isinstance(k, tuple) and len(k) == 4 else k)
    return tuple(out)


def foreach_unscale_and_check_(srcs: list, dsts: list, inv_scale: Any, found_inf: Any, *,
                               launch: tuple[int, int] | None = None) -> None:
    """:func:`unscale_and_check_` over many buffers, with as few launches as possible.

    Consecutive pieces of one allocation are joined into one buffer; the rest go, grouped by
    src dtype, up to ``MAX_BUFFERS_PER_LAUNCH`` pairs per launch of a multi-buffer kernel
    (torch's multi-tensor apply). The layout is planned once per list of buffers (keyed by
    their addresses, sizes and dtypes; it keeps no array alive).
    """
    key = (tuple(_array_key(a) for a in srcs), tuple(_array_key(a) for a in dsts))
    groups = _FOREACH.get(key)
    if groups is None:
        groups = _remember(_FOREACH, key, _layout(list(srcs), list(dsts)))
    inv = _host_inv(inv_scale)
    f_key = _array_key(found_inf)
    extra: tuple[Any, ...] = () if inv is not None else (inv_scale,)
    extra_keys = tuple(_array_key(a) for a in extra)

    def pieces(arrays: list, r: _Run) -> list:
        return [arrays[i] for i in range(r.first, r.last + 1) if arrays[i].size]

    for runs in groups:
        s_keys = _run_keys(srcs, runs)
        d_keys = tuple(sk if r.in_place else dk for r, sk, dk in
                       zip(runs, s_keys, _run_keys(dsts, runs)))
        n = max(r.numel for r in runs)
        if len(runs) == 1:
            r = runs[0]
            kernel = _unscale_kernel if inv is not None else _unscale_kernel_device_inv

            def one(r: _Run = r) -> tuple[Any, ...]:
                src = _joined(pieces(srcs, r), r.numel)
                dst = src if r.in_place else _joined(pieces(dsts, r), r.numel)
                return (src, dst, found_inf, *extra)

            plan = _plan_for(kernel, s_keys + d_keys + (f_key,) + extra_keys, one, n, launch)
            s, d, f = plan.views[:3]
            plan.launch(s, d, inv if inv is not None else plan.views[3], f)
            continue
        width = 4 if len(runs) <= 4 else MAX_BUFFERS_PER_LAUNCH  # two compiled widths
        pad = width - len(runs)                                  # never read: k < count

        def many(runs: list[_Run] = runs, pad: int = pad) -> tuple[Any, ...]:
            ss = [_joined(pieces(srcs, r), r.numel) for r in runs]
            ds = [s if r.in_place else _joined(pieces(dsts, r), r.numel)
                  for r, s in zip(runs, ss)]
            return (*ss, *[ss[0]] * pad, *ds, *[ds[0]] * pad, found_inf, *extra)

        keys = (s_keys + (s_keys[0],) * pad + d_keys + (d_keys[0],) * pad + (f_key,)
                + extra_keys)
        kernel = _foreach_unscale_kernel if inv is not None else _foreach_unscale_kernel_device_inv
        plan = _plan_for(kernel, keys, many, n, launch)
        views = plan.views
        plan.launch(views[:width], views[width:2 * width], np.int64(len(runs)),
                    inv if inv is not None else views[2 * width + 1], views[2 * width])


def update_scale_(scale: Any, growth_tracker: Any, found_inf: Any, growth_factor: float,
                  backoff_factor: float, growth_interval: int) -> None:
    """torch's ``_amp_update_scale_`` as a one-thread kernel (scale and tracker stay on the
    GPU); then every flag in ``found_inf`` is zeroed for the next step."""
    plan = _plan(_update_scale_kernel, (scale, growth_tracker, found_inf), 1, (1, 1))
    s, t, f = plan.views
    plan.launch(s, t, f, float(growth_factor), float(backoff_factor), int(growth_interval))


def master_to_model(master: Any, model: Any, *, launch: tuple[int, int] | None = None) -> None:
    """``model[...] = master.astype(float16)`` (round to nearest even), one pass on the GPU."""
    n = int(master.size)
    if n:
        plan = _plan(_to_half_kernel, (master, model), n, launch)
        plan.launch(*plan.views)
