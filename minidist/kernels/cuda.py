"""numba.cuda kernels for mixed precision: the GPU twins of ``cpu.py``, on CuPy's stream.

    from minidist.kernels import cuda as kcuda      # imports numba.cuda; kernels compile lazily
    found = kcuda.unscale_and_check(grads16, master32, 1 / 65536)    # CuPy arrays in
    kcuda.update_scale_(scale, tracker, found_inf, 2.0, 0.5, 2000)   # 1 thread, no host sync

Arguments are checked by ``minidist.kernels`` before they get here; call these through it
unless you have validated them yourself. Under Numba's simulator (``NUMBA_ENABLE_CUDASIM=1`` set
before numba is imported) the same functions run on NumPy arrays, which is how CI tests them.

The kernels and the Numba that compiles them are in ``cuda_kernels.py``, the launch machinery
in ``cuda_launch.py``, the buffer keys and the multi-buffer layout in ``cuda_buffers.py``.

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
"""

from __future__ import annotations

import collections
import math
from typing import Any, Hashable

import numpy as np

from minidist.envvars import env
from minidist.kernels.cuda_buffers import (MAX_BUFFERS_PER_LAUNCH, Run, array_key,
                                           cupy_module, is_cupy_array, joined_array, plan_runs,
                                           run_keys)
from minidist.kernels.cuda_kernels import (JIT, SIMULATOR, check_usable, cuda,
                                           foreach_unscale_kernel,
                                           foreach_unscale_kernel_device_inv, to_half_kernel,
                                           unscale_kernel, unscale_kernel_device_inv,
                                           update_scale_kernel)
from minidist.kernels.cuda_launch import PackedLaunch, PlanStats, configure_quietly
from minidist.kernels.fallback import default_signature, private_copies

__all__ = ["unscale_and_check", "unscale_and_check_", "foreach_unscale_and_check_",
           "update_scale_", "master_to_model", "SIMULATOR", "JIT", "check_usable", "signature",
           "rehearse", "PLAN_STATS", "clear_plans", "configure_quietly", "launch_plan"]

THREADS_PER_BLOCK = 256
BLOCKS_PER_SM = 8      # 8 x 256 = 2048 resident threads per SM on Volta..Hopper: a full GPU
UNROLL = 4             # loads in flight per thread (the kernels are written out for 4)
PLAN_CACHE_SIZE = 512
FAST_LAUNCH = env("MINIDIST_CUDA_LAUNCH") != "dispatcher"


# ----------------------------------------------------------------- launch plans

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


def _view(a: Any, key: Hashable) -> Any:
    """The Numba view of ``a`` (flat), built once per (address, size, dtype)."""
    view = _VIEWS.get(key)
    if view is None:
        PLAN_STATS.views_built += 1
        if is_cupy_array(a):  # no owner: the plan must not keep a freed buffer alive
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
    if cupy_module is None or SIMULATOR:
        return 0
    return int(cupy_module.cuda.get_current_stream().ptr)


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


def launch_plan(kernel: Any, arrays: tuple[Any, ...], n: int,
                launch: tuple[int, int] | None = None) -> LaunchPlan:
    """The cached ``LaunchPlan`` of ``kernel`` over ``arrays`` (CuPy, or NumPy under the
    simulator) with a grid for ``n`` elements: ``plan.launch(*plan.views, *scalars)``."""
    return _plan(kernel, arrays, n, launch)


def _plan(kernel: Any, arrays: tuple[Any, ...], n: int,
          launch: tuple[int, int] | None) -> LaunchPlan:
    keys = tuple(array_key(a) for a in arrays)
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
    if cupy_module is not None and not SIMULATOR:
        cupy_module.cuda.get_current_stream().synchronize()


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
        plan = _plan(unscale_kernel, (src, dst, found_inf), n, launch)
        s, d, f = plan.views
        plan.launch(s, d, inv, f)
    else:
        plan = _plan(unscale_kernel_device_inv, (src, dst, found_inf, inv_scale), n, launch)
        s, d, f, i = plan.views
        plan.launch(s, d, i, f)


def unscale_and_check(src: Any, dst: Any, inv_scale: Any, *,
                      launch: tuple[int, int] | None = None) -> bool:
    """:func:`unscale_and_check_` with a fresh flag, read back: this one syncs the stream."""
    if is_cupy_array(src):
        found = cupy_module.zeros(1, dtype=np.float32)
        unscale_and_check_(src, dst, inv_scale, found, launch=launch)
        return bool(float(found.get()[0]) != 0.0)
    found_host = np.zeros(1, dtype=np.float32)  # the simulator (or Numba-managed host arrays)
    unscale_and_check_(src, dst, inv_scale, found_host, launch=launch)
    return bool(found_host[0] != 0.0)


def foreach_unscale_and_check_(srcs: list, dsts: list, inv_scale: Any, found_inf: Any, *,
                               launch: tuple[int, int] | None = None) -> None:
    """:func:`unscale_and_check_` over many buffers, with as few launches as possible.

    Consecutive pieces of one allocation are joined into one buffer; the rest go, grouped by
    src dtype, up to ``MAX_BUFFERS_PER_LAUNCH`` pairs per launch of a multi-buffer kernel
    (torch's multi-tensor apply). The layout is planned once per list of buffers (keyed by
    their addresses, sizes and dtypes; it keeps no array alive).
    """
    key = (tuple(array_key(a) for a in srcs), tuple(array_key(a) for a in dsts))
    groups = _FOREACH.get(key)
    if groups is None:
        groups = _remember(_FOREACH, key, plan_runs(list(srcs), list(dsts)))
    inv = _host_inv(inv_scale)
    f_key = array_key(found_inf)
    extra: tuple[Any, ...] = () if inv is not None else (inv_scale,)
    extra_keys = tuple(array_key(a) for a in extra)

    def pieces(arrays: list, r: Run) -> list:
        return [arrays[i] for i in range(r.first, r.last + 1) if arrays[i].size]

    for runs in groups:
        s_keys = run_keys(srcs, runs)
        d_keys = tuple(sk if r.in_place else dk for r, sk, dk in
                       zip(runs, s_keys, run_keys(dsts, runs)))
        n = max(r.numel for r in runs)
        if len(runs) == 1:
            r = runs[0]
            kernel = unscale_kernel if inv is not None else unscale_kernel_device_inv

            def one(r: Run = r) -> tuple[Any, ...]:
                src = joined_array(pieces(srcs, r), r.numel)
                dst = src if r.in_place else joined_array(pieces(dsts, r), r.numel)
                return (src, dst, found_inf, *extra)

            plan = _plan_for(kernel, s_keys + d_keys + (f_key,) + extra_keys, one, n, launch)
            s, d, f = plan.views[:3]
            plan.launch(s, d, inv if inv is not None else plan.views[3], f)
            continue
        width = 4 if len(runs) <= 4 else MAX_BUFFERS_PER_LAUNCH  # two compiled widths
        pad = width - len(runs)                                  # never read: k < count

        def many(runs: list[Run] = runs, pad: int = pad) -> tuple[Any, ...]:
            ss = [joined_array(pieces(srcs, r), r.numel) for r in runs]
            ds = [s if r.in_place else joined_array(pieces(dsts, r), r.numel)
                  for r, s in zip(runs, ss)]
            return (*ss, *[ss[0]] * pad, *ds, *[ds[0]] * pad, found_inf, *extra)

        keys = (s_keys + (s_keys[0],) * pad + d_keys + (d_keys[0],) * pad + (f_key,)
                + extra_keys)
        kernel = foreach_unscale_kernel if inv is not None else foreach_unscale_kernel_device_inv
        plan = _plan_for(kernel, keys, many, n, launch)
        views = plan.views
        plan.launch(views[:width], views[width:2 * width], np.int64(len(runs)),
                    inv if inv is not None else views[2 * width + 1], views[2 * width])


def update_scale_(scale: Any, growth_tracker: Any, found_inf: Any, growth_factor: float,
                  backoff_factor: float, growth_interval: int) -> None:
    """torch's ``_amp_update_scale_`` as a one-thread kernel (scale and tracker stay on the
    GPU); then every flag in ``found_inf`` is zeroed for the next step."""
    plan = _plan(update_scale_kernel, (scale, growth_tracker, found_inf), 1, (1, 1))
    s, t, f = plan.views
    plan.launch(s, t, f, float(growth_factor), float(backoff_factor), int(growth_interval))


def master_to_model(master: Any, model: Any, *, launch: tuple[int, int] | None = None) -> None:
    """``model[...] = master.astype(float16)`` (round to nearest even), one pass on the GPU."""
    n = int(master.size)
    if n:
        plan = _plan(to_half_kernel, (master, model), n, launch)
        plan.launch(*plan.views)
