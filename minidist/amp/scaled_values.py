"""What a GradScaler walks and unscales besides the fused kernel's work.

``tensors_in`` / ``map_tensors``: the Tensors in ``scale()``'s outputs (nested lists and tuples);
``params_of``: an optimizer's parameters; ``fusable``: can ``kernels.unscale_and_check_`` take
this pair (float16/float32 in, float32 out, contiguous); ``unscale_unfused``: the two plain
passes for the rest (float64 gradients).
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from minidist import xp as backend
from minidist.logger import rank_prefix
from minidist.tensor import Tensor


def tensors_in(outputs: Any) -> Iterator[Any]:
    if isinstance(outputs, Tensor):
        yield outputs
    elif isinstance(outputs, (list, tuple)):
        for o in outputs:
            yield from tensors_in(o)


def map_tensors(outputs: Any, fn: Any) -> Any:
    if isinstance(outputs, Tensor):
        return fn(outputs)
    if isinstance(outputs, (list, tuple)):
        return type(outputs)(map_tensors(o, fn) for o in outputs)
    raise TypeError(f"{rank_prefix()} GradScaler.scale: outputs must be Tensors or (nested) "
                    f"lists/tuples of Tensors, got {type(outputs).__name__}.")


def params_of(optimizer: Any) -> Iterator[Any]:
    for group in optimizer.param_groups:
        yield from group["params"]


def fusable(src: Any, dst: Any) -> bool:
    """Can the fused kernel unscale src into dst (float16/float32 in, float32 out, contiguous)?"""
    return (src.dtype in (np.float16, np.float32) and dst.dtype == np.float32
            and src.flags.c_contiguous and dst.flags.c_contiguous)


def unscale_unfused(src: Any, dst: Any, inv: Any, found: Any) -> None:
    """``dst = src * inv`` and ``found[0] = 1`` if src has inf/NaN, as two plain passes."""
    xp = backend.get_array_module(src)
    bad = ~xp.isfinite(src).all()  # float64 grads: NumPy ops, not a kernel; no host read
    xp.maximum(found, bad.astype(found.dtype), out=found)
    xp.multiply(src, inv.astype(dst.dtype).reshape(()), out=dst)
