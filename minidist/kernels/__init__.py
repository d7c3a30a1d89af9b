"""Fused AMP kernels: unscale + inf/NaN check, the dynamic loss-scale update, master -> model.

    from minidist import kernels
    found = kernels.unscale_and_check(grad32, grad32, 1 / scale)       # in place, one pass
    found = kernels.unscale_and_check(grad16, master32, 1 / scale)     # fp16 -> fp32 master
    kernels.unscale_and_check_(src, dst, inv_scale, found_inf)         # flag on the device
    kernels.foreach_unscale_and_check_(srcs, dsts, inv_scale, found_inf)  # a list: 1 launch
    kernels.update_scale_(scale, tracker, found_inf, 2.0, 0.5, 2000)   # torch's rule; found = 0
    kernels.master_to_model(master32, model16)                         # round to nearest even
    kernels.implementation(grad32)                                     # -> "numba-cpu"

Every entry point checks its arguments (dtypes, sizes, contiguity, devices) and raises
``ValueError`` before anything runs, then dispatches on the array module of its first argument:

    NumPy array  ->  cpu.py   (Numba @njit, parallel, cached)   else  reference.py (NumPy)
    CuPy array   ->  cuda.py  (numba.cuda, CuPy's stream)       else  reference.py (CuPy)

The compiled backends are imported on first use (``import minidist`` does not import Numba),
and each op compiles on its first call. If a backend cannot be imported, compiled or launched
on this machine (any exception), a single ``RuntimeWarning`` says why and how to fix it, and
that backend's calls go to the reference, which computes the same bits (slower). The first call
of each op rehearses on private copies, so that happens before any caller data changed
(``fallback.py``: ``CompiledBackend``, reusable for other kernels).
``MINIDIST_KERNELS=reference`` chooses the reference on purpose (no warning).

Contract (as ATen's ``AmpKernels.cu``): unscaling computes ``float32(src) * inv_scale`` in
float32 and checks the INPUT for NaN/inf; ``found_inf`` is zeroed by the caller, once per step,
and kernels only ever set it to 1.0, so one flag collects many buffers without a host sync.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from minidist import xp as backend
from minidist.kernels import reference
from minidist.kernels.fallback import REFERENCE, CompiledBackend
from minidist.logger import rank_prefix

__all__ = ["unscale_and_check", "unscale_and_check_", "foreach_unscale_and_check_",
           "update_scale_", "master_to_model", "implementation", "fallback_reason",
           "CompiledBackend", "REFERENCE", "NUMBA_CPU", "NUMBA_CUDA"]

_F32, _F16 = np.dtype(np.float32), np.dtype(np.float16)

NUMBA_CPU = "numba-cpu"
NUMBA_CUDA = "numba-cuda"


# ----------------------------------------------------------------- backends

_CPU = CompiledBackend(NUMBA_CPU, "minidist.kernels.cpu",
                       f"For the fused CPU kernels install a numba that supports NumPy "
                       f"{np.__version__} (`pip install -U numba`); MINIDIST_KERNELS=reference "
                       "chooses the reference without this warning.")
_CUDA = CompiledBackend(NUMBA_CUDA, "minidist.kernels.cuda",
                        "Install the GPU extra for your CUDA version (`pip install "
                        "'minidist[gpu-cu12]'` or `'minidist[gpu-cu13]'`, see docs/amp.md), and "
                        "leave NUMBA_ENABLE_CUDASIM unset, for the fused GPU kernels.")


def _backend_of(array: Any) -> CompiledBackend:
    return _CUDA if backend.is_device_array(array) else _CPU


def implementation(array: Any) -> str:
    """Which implementation the kernels use for ``array``: ``"numba-cpu"``, ``"numba-cuda"`` or
    ``"reference"``. The first call for a device imports its backend (not compiling anything).

    >>> import numpy as np
    >>> implementation(np.zeros(3, np.float32)) in ("numba-cpu", "reference")
    True
    """
    if not (isinstance(array, np.ndarray) or backend.is_device_array(array)):
        raise ValueError(f"{rank_prefix()} kernels.implementation: expected a NumPy or CuPy "
                         f"array, got {type(array).__name__}.")
    chosen = _backend_of(array)
    return chosen.name if chosen.get() is not None else REFERENCE


def fallback_reason(array: Any) -> str | None:
    """Why the kernels for ``array``'s device use the reference (the warning's cause), or None
    while the compiled kernels run (or were not tried yet).

    >>> import numpy as np
    >>> fallback_reason(np.zeros(3, np.float32)) is None or "numba" in fallback_reason(np.zeros(3))
    True
    """
    return _backend_of(array).reason or None


def _call(name: str, first: Any, *args: Any) -> Any:
    """Run ``name`` from the backend of ``first`` (the fallback policy: ``fallback.py``)."""
    return _backend_of(first).call(name, getattr(reference, name), *args)


# ----------------------------------------------------------------- argument checks

def _error(op: str, what: str, fix: str) -> ValueError:
    return ValueError(f"{rank_prefix()} kernels.{op}: {what}. {fix}")


def _module_of(op: str, name: str, a: Any) -> str:
    if isinstance(a, np.ndarray):
        return "numpy"
    if backend.is_device_array(a):
        return "cupy"
    raise _error(op, f"{name} must be a NumPy or CuPy array, got {type(a).__name__}",
                 "Pass the array itself (a Tensor's .data), not a Python list or scalar")


def _same_module(op: str, names: tuple[str, ...], arrays: tuple[Any, ...]) -> str:
    if all(type(a) is np.ndarray for a in arrays):  # the common case, fast
        return "numpy"
    mods = [_module_of(op, n, a) for n, a in zip(names, arrays)]
    if len(set(mods)) != 1:
        got = ", ".join(f"{n}: {m}" for n, m in zip(names, mods))
        raise _error(op, f"the arrays live on different devices ({got})",
                     "Move them to one device first (minidist.xp.to_device / to_host)")
    return mods[0]


def _check_dtype(op: str, name: str, a: Any, allowed: tuple[np.dtype, ...], fix: str) -> None:
    if a.dtype not in allowed:
        want = " or ".join(t.name for t in allowed)
        raise _error(op, f"{name} has dtype {a.dtype}, expected {want}", fix)


def _check_contiguous(op: str, name: str, a: Any) -> None:
    if not a.flags.c_contiguous:
        raise _error(op, f"{name} (shape {tuple(a.shape)}, strides {tuple(a.strides)}) is not "
                     "C-contiguous", f"Pass a contiguous array, e.g. {name}.copy(), or the "
                     "contiguous buffer the view was taken from")


def _check_writeable(op: str, name: str, a: Any) -> None:
    if isinstance(a, np.ndarray) and not a.flags.writeable:
        raise _error(op, f"{name} is read-only", f"Pass a writeable array as {name}")


def _check_one_element(op: str, name: str, a: Any, dtype: np.dtype) -> None:
    if a.dtype != dtype:
        _check_dtype(op, name, a, (dtype,), f"Create it as xp.zeros(1, dtype=xp.{dtype.name})")
    if a.size != 1:
        raise _error(op, f"{name} has {a.size} elements (shape {tuple(a.shape)}), expected 1",
                     f"Pass a 1-element array, as torch's {name}")
    _check_writeable(op, name, a)


def _address(a: Any) -> int:
    return int(a.data.ptr) if backend.is_device_array(a) else int(a.ctypes.data)


def _may_overlap(a: Any, b: Any) -> bool:
    """Do the memory extents of a and b intersect? (NumPy: a bounds check, no pointer objects.)"""
    if isinstance(a, np.ndarray):
        return bool(np.may_share_memory(a, b))
    a0, b0 = _address(a), _address(b)
    return a0 < b0 + b.nbytes and b0 < a0 + a.nbytes


def _check_src_dst(op: str, src: Any, dst: Any, src_name: str, dst_name: str) -> None:
    """Same number of elements, both contiguous, dst writeable, no partial overlap."""
    if src.size != dst.size:
        raise _error(op, f"{src_name} has {src.size} elements but {dst_name} has {dst.size}",
                     f"Give {dst_name} exactly as many elements as {src_name}")
    _check_contiguous(op, src_name, src)
    _check_contiguous(op, dst_name, dst)
    _check_writeable(op, dst_name, dst)
    if src is dst or src.size == 0 or not _may_overlap(src, dst):
        return
    if _address(src) != _address(dst) or src.dtype != dst.dtype:  # same buffer is in place
        raise _error(op, f"{dst_name} overlaps {src_name} without being the same buffer",
                     f"Write into a separate {dst_name}, or (float32 only) pass the same array "
                     "twice to work in place")


def _check_inv_scale(op: str, inv_scale: Any, module: str) -> Any:
    """A host float, or a float32[1] array (kept as is when it is on the device with src)."""
    if type(inv_scale) is float or (isinstance(inv_scale, numbers.Real)
                                    and not isinstance(inv_scale, bool)):
        return float(inv_scale)
    if isinstance(inv_scale, np.ndarray) or backend.is_device_array(inv_scale):
        _check_dtype(op, "inv_scale", inv_scale, (_F32,),
                     "Keep inv_scale float32, as torch does (1 / scale computed in float64, "
                     "then rounded to float32)")
        if inv_scale.size != 1:
            raise _error(op, f"inv_scale has {inv_scale.size} elements, expected 1",
                         "Pass a number or a 1-element float32 array")
        if isinstance(inv_scale, np.ndarray):
            return float(inv_scale.reshape(-1)[0])
        if module != "cupy":
            raise _error(op, "inv_scale is a CuPy (GPU) array but the gradients are NumPy",
                         "Pass inv_scale as a number or a NumPy array")
        return inv_scale
    raise _error(op, f"inv_scale must be a number or a 1-element float32 array, got "
                 f"{type(inv_scale).__name__}", "Pass 1 / scale")


def _check_unscale(op: str, src: Any, dst: Any) -> str:
    if src is dst and src.dtype == _F32:  # fp32 in place, the common case: fewer checks
        if type(src) is np.ndarray:
            if src.flags.c_contiguous and src.flags.writeable:
                return "numpy"
        elif backend.is_device_array(src) and src.flags.c_contiguous:
            return "cupy"
    module = _same_module(op, ("src", "dst"), (src, dst))
    _check_dtype(op, "src", src, (_F32, _F16), "Unscale float32 or float16 gradients")
    _check_dtype(op, "dst", dst, (_F32,),
                 "dst receives fp32 master gradients: unscale fp16 grads into a float32 array "
                 "(in-place fp16 unscaling underflows small gradients), or pass src as dst "
                 "for float32 grads")
    _check_src_dst(op, src, dst, "src", "dst")
    return module


# ----------------------------------------------------------------- public API

def unscale_and_check(src: Any, dst: Any, inv_scale: Any) -> bool:
    """``dst = float32(src) * inv_scale`` in one pass; True when ``src`` holds a NaN or an inf.

    Args:
        src: float32 or float16 array (NumPy or CuPy), C-contiguous: the scaled gradients.
        dst: float32 array with as many elements (any shape), C-contiguous; may be ``src``
            itself when src is float32 (in place). For fp16 grads: the fp32 master grads.
        inv_scale: 1 / scale: a Python float, or a 1-element float32 array.

    Returns:
        True if any element of ``src`` (the INPUT, as torch checks it) is not finite. On a GPU
        this reads a flag back (a stream sync); :func:`unscale_and_check_` does not.

    Raises:
        ValueError: wrong dtypes, sizes, devices, a non-contiguous or overlapping array.

    >>> import numpy as np
    >>> g = np.array([2.0, 4.0, np.inf], np.float32)
    >>> unscale_and_check(g, g, 0.5), g.tolist()
    (True, [1.0, 2.0, inf])
    """
    module = _check_unscale("unscale_and_check", src, dst)
    inv = _check_inv_scale("unscale_and_check", inv_scale, module)
    return bool(_call("unscale_and_check", src, src, dst, inv))


def unscale_and_check_(src: Any, dst: Any, inv_scale: Any, found_inf: Any) -> None:
    """:func:`unscale_and_check` that sets ``found_inf[0] = 1.0`` instead of returning.

    ``found_inf`` is a float32[1] array on the same device as ``src``. It is never zeroed here:
    the caller zeroes it once per step, so one flag collects many buffers, and on a GPU nothing
    waits for the host (``inv_scale`` may be a float32[1] device array too).

    >>> import numpy as np
    >>> found = np.zeros(1, np.float32)
    >>> g16 = np.array([1024, 2048], np.float16); master = np.empty(2, np.float32)
    >>> unscale_and_check_(g16, master, 1 / 1024, found); master.tolist(), found.tolist()
    ([1.0, 2.0], [0.0])
    """
    module = _check_unscale("unscale_and_check_", src, dst)
    inv = _check_inv_scale("unscale_and_check_", inv_scale, module)
    _same_module("unscale_and_check_", ("src", "found_inf"), (src, found_inf))
    _check_one_element("unscale_and_check_", "found_inf", found_inf, _F32)
    _call("unscale_and_check_", src, src, dst, inv, found_inf)


def foreach_unscale_and_check_(srcs: Any, dsts: Any, inv_scale: Any, found_inf: Any) -> None:
    """:func:`unscale_and_check_` over a list of buffers with one flag: on a GPU as few
    launches as possible (torch's ``_amp_foreach_non_finite_check_and_unscale_``).

    Args:
        srcs: list of float32/float16 arrays (C-contiguous), e.g. every gradient of a step.
        dsts: list of float32 arrays, ``dsts[k]`` as many elements as ``srcs[k]``; an entry may
            be its ``srcs[k]`` (float32 in place).
        inv_scale, found_inf: as :func:`unscale_and_check_` (one flag for the whole list).

    On a GPU, pairs that are consecutive pieces of one allocation (as the views of one flat
    buffer) are joined into one, and up to ``cuda.MAX_BUFFERS_PER_LAUNCH`` pairs go into one
    launch of a multi-buffer kernel.

    >>> import numpy as np
    >>> a, b = np.array([2.0, 4.0], np.float32), np.array([8.0], np.float16)
    >>> m, found = np.empty(1, np.float32), np.zeros(1, np.float32)
    >>> foreach_unscale_and_check_([a, b], [a, m], 0.5, found); a.tolist(), m.tolist(), found[0]
    ([1.0, 2.0], [4.0], np.float32(0.0))
    """
    op = "foreach_unscale_and_check_"
    srcs, dsts = list(srcs), list(dsts)
    if len(srcs) != len(dsts):
        raise _error(op, f"{len(srcs)} srcs but {len(dsts)} dsts", "Pass one dst per src")
    if not srcs:
        return
    module = _same_module(op, ("srcs[0]", "found_inf"), (srcs[0], found_inf))
    for k, (src, dst) in enumerate(zip(srcs, dsts)):
        if _check_unscale(op, src, dst) != module:
            raise _error(op, f"srcs[{k}] lives on another device than srcs[0]",
                         "Unscale each device's buffers in its own call")
    inv = _check_inv_scale(op, inv_scale, module)
    _check_one_element(op, "found_inf", found_inf, _F32)
    _call(op, srcs[0], srcs, dsts, inv, found_inf)


def update_scale_(scale: Any, growth_tracker: Any, found_inf: Any, growth_factor: float,
                  backoff_factor: float, growth_interval: int) -> None:
    """torch's ``_amp_update_scale_``, in place on 1-element arrays (on a GPU: a 1-thread
    kernel, so the scale never leaves the device), then ``found_inf[:] = 0``: the flags are
    ready for the next step without a zeroing launch (torch's op leaves them as they are).

    Args:
        scale: float32[1], the current loss scale.
        growth_tracker: int32[1], successful steps since the last change.
        found_inf: float32[k], k >= 1 flags (one per bucket or optimizer, say); any nonzero
            one means this step's gradients had a NaN/inf. All k are zeroed.
        growth_factor, backoff_factor, growth_interval: GradScaler's settings.

    The rule (``reference.update_scale_rule``)::

        found_inf        -> scale *= backoff_factor; tracker = 0
        else tracker + 1 == growth_interval
                         -> scale *= growth_factor (kept if the result would be inf); tracker = 0
        else             -> tracker += 1

    >>> import numpy as np
    >>> s, t, f = np.array([8.0], np.float32), np.array([1], np.int32), np.zeros(1, np.float32)
    >>> update_scale_(s, t, f, 2.0, 0.5, 2); s.tolist(), t.tolist()
    ([16.0], [0])
    >>> f = np.array([0.0, 1.0], np.float32); update_scale_(s, t, f, 2.0, 0.5, 2)
    >>> s.tolist(), t.tolist(), f.tolist()
    ([8.0], [0], [0.0, 0.0])
    """
    op = "update_scale_"
    _same_module(op, ("scale", "growth_tracker", "found_inf"), (scale, growth_tracker, found_inf))
    _check_one_element(op, "scale", scale, _F32)
    _check_one_element(op, "growth_tracker", growth_tracker, np.dtype(np.int32))
    _check_dtype(op, "found_inf", found_inf, (_F32,), "Create it as xp.zeros(k, dtype=xp.float32)")
    if found_inf.size < 1 or not found_inf.flags.c_contiguous:
        raise _error(op, f"found_inf has {found_inf.size} elements (shape "
                     f"{tuple(found_inf.shape)})", "Pass a contiguous float32 array of k >= 1 "
                     "flags (one per bucket or optimizer)")
    _check_writeable(op, "found_inf", found_inf)
    for name, value in (("growth_factor", growth_factor), ("backoff_factor", backoff_factor)):
        if not isinstance(value, numbers.Real) or isinstance(value, bool):
            raise _error(op, f"{name} must be a number, got {type(value).__name__}",
                         "Pass GradScaler's float setting")
    if not isinstance(growth_interval, numbers.Integral) or isinstance(growth_interval, bool) \
            or growth_interval < 1:
        raise _error(op, f"growth_interval must be an int >= 1, got {growth_interval!r}",
                     "Pass GradScaler's growth_interval (default 2000)")
    _call(op, scale, scale, growth_tracker, found_inf, float(growth_factor),
          float(backoff_factor), int(growth_interval))


def master_to_model(master: Any, model: Any) -> None:
    """Copy float32 ``master`` into float16 ``model`` (round to nearest even), in place.

    Values beyond fp16's range become +-inf, exactly as ``master.astype(np.float16)``.

    >>> import numpy as np
    >>> model = np.empty(3, np.float16)
    >>> master_to_model(np.array([1.0, 1 + 2**-11, 1e6], np.float32), model); model.tolist()
    [1.0, 1.0, inf]
    """
    op = "master_to_model"
    _same_module(op, ("master", "model"), (master, model))
    _check_dtype(op, "master", master, (_F32,), "master weights are float32")
    _check_dtype(op, "model", model, (_F16,), "model weights are float16")
    _check_src_dst(op, master, model, "master", "model")
    _call(op, master, master, model)
