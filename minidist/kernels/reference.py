"""The NumPy (and CuPy) reference of every fused AMP kernel: the oracle the compiled ones match.

    from minidist.kernels import reference as ref
    found = ref.unscale_and_check(grads16, master32, 1 / 65536)    # two passes, whole-array ops
    ref.update_scale_(scale, tracker, found_inf, 2.0, 0.5, 2000)   # torch's dynamic-scale rule

Each function here is written with whole-array xp operations (several passes over memory), so it
is easy to read and obviously right. ``kernels/cpu.py`` (Numba ``@njit``) and ``kernels/cuda.py``
(``numba.cuda``) compute the same results bit for bit in one pass; the tests feed the same input
to all three.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minidist import xp as backend


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
    xp = backend.get_array_module(src)
    found = not bool(xp.isfinite(src).all())
    xp.multiply(src, _inv_scale_value(inv_scale), out=dst, dtype=np.float32)
    return found


def unscale_and_check_(src: Any, dst: Any, inv_scale: Any, found_inf: Any) -> None:
    """Like :func:`unscale_and_check`, but sets ``found_inf[0] = 1.0`` instead of returning.

    ``found_inf`` is a 1-element float32 array on the same device as ``src``; it is never
    zeroed here (the caller zeroes it once per step, as torch's ``found_inf`` contract), so one
    flag can collect the result of many buffers without a host synchronization.
    """
    if unscale_and_check(src, dst, inv_scale):
        found_inf[0] = 1.0


def update_scale_(scale: Any, growth_tracker: Any, found_inf: Any, growth_factor: float,
                  backoff_factor: float, growth_interval: int) -> None:
    """torch's ``_amp_update_scale_``, in place on 1-element arrays.

    Args:
        scale: float32[1], the current loss scale.
        growth_tracker: int32[1], successful steps since the last change.
        found_inf: float32[1], nonzero if this step's gradients had a NaN/inf.
        growth_factor, backoff_factor, growth_interval: GradScaler's settings.

    The rule::

        found_inf        -> scale *= backoff_factor; tracker = 0
        else tracker + 1 == growth_interval
                         -> scale *= growth_factor (kept if the result would be inf); tracker = 0
        else             -> tracker += 1
    """
    if float(found_inf[0]) != 0.0:
        scale[0] = np.float32(float(scale[0]) * backoff_factor)
        growth_tracker[0] = 0
        return
    successful = int(growth_tracker[0]) + 1
    if successful == growth_interval:
        grown = np.float32(float(scale[0]) * growth_factor)
        if np.isfinite(grown):
            scale[0] = grown
        growth_tracker[0] = 0
    else:
        growth_tracker[0] = successful


def master_to_model(master: Any, model: Any) -> None:
    """Copy float32 ``master`` into float16 ``model`` (round to nearest even), in place."""
    model[...] = master.astype(model.dtype)
