"""Fused AMP kernels: unscale + inf/NaN check, the dynamic loss-scale update, master -> model.

    from minidist import kernels
    found = kernels.unscale_and_check(grad32, grad32, 1 / scale)       # in place, one pass
    found = kernels.unscale_and_check(grad16, master32, 1 / scale)     # fp16 -> fp32 master
    kernels.unscale_and_check_(src, dst, inv_scale, found_inf)         # flag on the device
    kernels.update_scale_(scale, tracker, found_inf, 2.0, 0.5, 2000)   # torch's rule
    kernels.master_to_model(master32, model16)                         # round to nearest even

Every entry point dispatches on the array module of its first argument. Today every call goes
to the NumPy/CuPy reference (``reference.py``).
"""

from __future__ import annotations

from minidist.kernels.reference import (master_to_model, unscale_and_check, unscale_and_check_,
                                        update_scale_)

__all__ = ["unscale_and_check", "unscale_and_check_", "update_scale_", "master_to_model"]
