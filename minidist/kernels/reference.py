"""The NumPy (and CuPy) reference of every fused AMP kernel: the oracle the compiled ones match.

    from minidist.kernels import reference as ref
    found = ref.unscale_and_check(grads16, master32, 1 / 65536)    # two passes, whole-array ops
    ref.update_scale_(scale, tracker, found_inf, 2.0, 0.5, 2000)   # torch's dynamic-scale rule

Each array function here is written with whole-array xp operations (several passes over
memory), so it is easy to read and obviously right. ``kernels/cpu.py`` (Numba ``@njit``) and
``kernels/cuda.py`` (``numba.cuda``) compute the same results bit for bit in one pass; the tests
feed the same input to all three.

The per-element logic is written ONCE, here, as scalar Python (``unscale_element``,
``update_scale_rule``); cpu.py compiles it with ``njit(inline="always")`` and cuda.py with
``cuda.jit(device=True)``, so the three implementations cannot drift apart. Numba caches cpu.py's
machine code keyed on cpu.py's own file stamp only: after editing a scalar function here, touch
cpu.py (or delete ``minidist/kernels/__pycache__/*.nbi``) so the cache is rebuilt.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from minidist import xp as backend


# ----------------------------------------------------------------- scalar logic (shared)

def unscale_element(value: Any, inv_scale: Any) -> tuple[Any, bool]:
    """One element of the fused unscale: ``(value * inv_scale, value is not finite)``.

    ``value`` and ``inv_scale`` are float32 (fp16 inputs are widened first: fp32 "opmath", as
    ATen's ``AmpKernels.cu``), so the product is rounded once, in float32. The check looks at
    the INPUT: an inf that ``* inv_scale`` would turn finite still counts.
    """
    return value * inv_scale, not math.isfinite(value)


def update_scale_rule(scale: Any, growth_tracker: Any, found_inf: Any, growth_factor: float,
                      backoff_factor: float, growth_interval: int) -> tuple[Any, Any]:
    """torch's ``_amp_update_scale_`` on scalars: returns ``(new_scale, new_growth_tracker)``.

    ``scale`` is a float32 value, the factors are float64 (``double`` in ATen), so each product
    is computed in float64 and narrowed to float32 once. A grown scale that would be inf is not
    taken (the tracker still resets); a backed-off scale has no lower bound.
    """
    if found_inf != 0.0:  # NaN counts too, as in C (`if (*found_inf)`)
        return np.float32(scale * backoff_factor), 0
    successful = growth_tracker + 1
    if successful == growth_interval:
        grown = np.float32(scale * growth_factor)
        if math.isfinite(grown):
            return grown, 0
        return np.float32(scale), 0
    return np.float32(scale), successful


# ----------------------------------------------------------------- whole-array references

def _inv_scale_value(inv_scale: Any) -> Any:
    """``inv_scale`` as a float32 scalar (host) or a 1-element float32 array (device)."""
    if hasattr(inv_scale, "shape") and getattr(inv_scale, "size", 1) == 1 and \
            backend.is_device_array(inv_scale):
        return inv_scale.astype(np.float32).reshape(())
    return np.float32(float(np.asarray(backend.to_host(inv_scale)).reshape(())))


def unscale_and_check(src: Any, dst: Any, inv_scale: Any) -> bool:
    """``dst = float32(src) * inv_scale``; True when ``src`` holds a NaN or an inf.

    Args:
        src: flat float32 or float16 array (the scaled gradients).
        dst: flat float32 array of the same length; may be ``src`` itself when src is float32.
        inv_scale: 1 / scale, a Python float or a 1-element float32 array.

    Returns:
        True if any element of ``src`` (the INPUT, as torch checks it) is not finite.
    """
    return bool(_unscale(src, dst, inv_scale))


def _unscale(src: Any, dst: Any, inv_scale: Any) -> Any:
    """The two passes: ``isfinite(src).all()`` (read src), then ``dst = src * inv`` (read src
    again, write dst). Returns "found" as a 0-d bool array (on the device for CuPy: no sync)."""
    xp = backend.get_array_module(src)
    found = ~xp.isfinite(src).all()  # computed before dst is written: dst may be src
    with np.errstate(over="ignore", invalid="ignore"):  # inf * inv_scale > 1 is inf: expected
        xp.multiply(src, _inv_scale_value(inv_scale), out=dst, dtype=np.float32)
    return found


def unscale_and_check_(src: Any, dst: Any, inv_scale: Any, found_inf: Any) -> None:
    """Like :func:`unscale_and_check`, but sets ``found_inf[0] = 1.0`` instead of returning.

    ``found_inf`` is a 1-element float32 array on the same device as ``src``; it is never
    zeroed here (the caller zeroes it once per step, as torch's ``found_inf`` contract), so one
    flag can collect the result of many buffers without a host synchronization.
    """
    xp = backend.get_array_module(src)
    found = _unscale(src, dst, inv_scale)
    xp.copyto(found_inf, np.float32(1.0), where=found)  # stays on the device for CuPy


def foreach_unscale_and_check_(srcs: list, dsts: list, inv_scale: Any, found_inf: Any) -> None:
    """:func:`unscale_and_check_` on each ``(srcs[k], dsts[k])`` pair, one shared flag."""
    for src, dst in zip(srcs, dsts):
        unscale_and_check_(src, dst, inv_scale, found_inf)


def update_scale_(scale: Any, growth_tracker: Any, found_inf: Any, growth_factor: float,
                  backoff_factor: float, growth_interval: int) -> None:
    """torch's ``_amp_update_scale_``, in place on 1-element arrays; then ``found_inf[:] = 0``.

    Args:
        scale: float32[1], the current loss scale.
        growth_tracker: int32[1], successful steps since the last change.
        found_inf: float32[k], k >= 1 flags (one per bucket or optimizer); any nonzero means
            this step's gradients had a NaN/inf. All are zeroed for the next step.
        growth_factor, backoff_factor, growth_interval: GradScaler's settings.

    The rule::

        found_inf        -> scale *= backoff_factor; tracker = 0
        else tracker + 1 == growth_interval
                         -> scale *= growth_factor (kept if the result would be inf); tracker = 0
        else             -> tracker += 1
    """
    flags = backend.to_host(found_inf).reshape(-1)
    found = 1.0 if bool((flags != 0).any()) else 0.0  # NaN != 0: counts, as in C
    with np.errstate(over="ignore"):  # a grown scale past float32 max is inf, then not taken
        new_scale, new_tracker = update_scale_rule(
            float(scale[0]), int(growth_tracker[0]), found, float(growth_factor),
            float(backoff_factor), int(growth_interval))
    scale[0] = new_scale  # reads above and writes here sync a CuPy stream (a fallback only)
    growth_tracker[0] = new_tracker
    found_inf[...] = 0


def master_to_model(master: Any, model: Any) -> None:
    """Copy float32 ``master`` into float16 ``model`` (round to nearest even), in place."""
    with np.errstate(over="ignore"):  # beyond 65504 rounds to inf, as torch's .half()
        model[...] = master.astype(model.dtype)
