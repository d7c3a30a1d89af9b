"""Autocast state: which ops run in float16 and which in float32 (per device type, per thread).

    from minidist.tensor import autocast_mode
    autocast_mode.set_autocast_dtype("cpu", "float16")      # what minidist.amp.autocast does
    x, w, b = autocast_mode.autocast_args("linear", x, w, b)  # inside an op: float32 -> float16

This module is the tensor layer's half of mixed precision, the way ``grad_mode`` is its half of
``no_grad``: it holds the state; the public context manager is :class:`minidist.amp.autocast`.
Every op named in ``POLICY`` starts by passing its tensor inputs through ``autocast_args``,
which, when autocast is on for the inputs' device, casts them with a differentiable ``astype``
(a node on the tape, so gradients flow back through the cast in the right dtype):

    policy            ops                                           inputs become
    lower_precision   matmul, linear, conv2d                        float32 -> float16
    fp32              softmax, log_softmax, cross_entropy,           float16 -> float32
                      mse_loss, layer_norm, exp, log, pow, sum
    (not listed)      everything else: add, mul, relu, dropout,     unchanged: NumPy's type
                      max_pool2d, reshape, ...                      promotion (float16 + float32
                                                                    -> float32 = torch's "promote")

**The cast cache** (torch's): a float32 parameter (a leaf that requires grad) cast to float16
inside an autocast region is cast ONCE; its later uses in the region (a weight shared by two
layers, a model called twice, gradient checkpointing's recompute) get the same float16 tensor,
one node on the tape, so its gradient is summed once. The cache is cleared when the outermost
region exits (``enter_region``/``exit_region``, called by ``amp.autocast``), so the next
step casts the updated weights. Activations are not cached (each is used once).

These are torch's autocast op lists, cut down to the ops minidist has. float64 inputs are never
cast (as in torch: float64 is not "eligible"). Outside autocast nothing is cast, and the only
cost of this module is one thread-local lookup per listed op.

On a GPU (CuPy) a float16 matmul is a real half-precision cuBLAS GEMM. On the CPU NumPy has no
float16 BLAS (a float16 matmul is far slower than float32), so ``linalg.mm`` EMULATES it:
the float16 operands are widened to float32 (exactly), multiplied with float32 BLAS, and the
product is rounded back to float16. Values, overflow to inf, underflow and rounding then behave
as a device's float16 GEMM with float32 accumulation does; only the speed differs.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy

from minidist import xp as backend
from minidist.tensor import dtypes, grad_mode

_state = threading.local()

LOWER_PRECISION = "lower_precision"
FP32 = "fp32"

POLICY: dict[str, str] = {
    "matmul": LOWER_PRECISION, "linear": LOWER_PRECISION, "conv2d": LOWER_PRECISION,
    "softmax": FP32, "log_softmax": FP32, "cross_entropy": FP32, "mse_loss": FP32,
    "layer_norm": FP32, "exp": FP32, "log": FP32, "pow": FP32, "sum": FP32,
}
"""Op name -> how autocast treats its floating inputs (torch's lists, for minidist's ops)."""

DEVICE_TYPES = ("cpu", "cuda")
SUPPORTED_DTYPES = dtypes.HALF  # float16, bfloat16 (``dt in SUPPORTED_DTYPES``)
LOW_PRECISION = SUPPORTED_DTYPES  # the dtypes the FP32 ops widen back to float32


def _active() -> dict[str, Any]:
    """``{device_type: dtype}`` for every device type where autocast is on (this thread)."""
    active = getattr(_state, "active", None)
    if active is None:
        active = _state.active = {}
    return active


def device_type_of(array: Any) -> str:
    """``"cuda"`` for a CuPy array, ``"cpu"`` for a NumPy one."""
    return "cuda" if backend.is_device_array(array) else "cpu"


def get_autocast_dtype(device_type: str) -> Any:
    """The dtype autocast uses for ``device_type`` ("cpu" or "cuda"), or None when it is off."""
    return _active().get(device_type)


def is_autocast_enabled(device_type: str = "cpu") -> bool:
    """True inside an enabled ``autocast(device_type)`` block on this thread."""
    return device_type in _active()


def set_autocast_dtype(device_type: str, dtype: Any) -> Any:
    """Turn autocast on for ``device_type`` with ``dtype`` (None: off); returns the previous value.

    Prefer the ``minidist.amp.autocast`` context manager, which restores the previous value.
    """
    active = _active()
    prev = active.get(device_type)
    if dtype is None:
        active.pop(device_type, None)
    else:
        active[device_type] = numpy.dtype(dtype)
    return prev


def lower_precision_op_count() -> int:
    """How many ops ran with float16 inputs because of autocast on this thread (ever)."""
    return getattr(_state, "lower_ops", 0)


def cast_counts() -> dict[str, int]:
    """How many casts autocast made on this thread (ever): ``{"weights": n, "others": m}``;
    ``"weights"`` counts parameter casts (once per region each, thanks to the cache)."""
    return dict(getattr(_state, "casts", {"weights": 0, "others": 0}))


def enter_region() -> None:
    """An autocast region begins (``amp.autocast.__enter__``): nesting depth + 1."""
    _state.depth = getattr(_state, "depth", 0) + 1


def exit_region() -> None:
    """An autocast region ends; leaving the outermost one clears the cast cache (torch's
    rule: the weights change between steps, their casts must not outlive the region)."""
    _state.depth = getattr(_state, "depth", 1) - 1
    if _state.depth <= 0:
        _state.depth = 0
        clear_autocast_cache()


def clear_autocast_cache() -> None:
    """Forget every cached cast of this thread (torch.clear_autocast_cache)."""
    cache = getattr(_state, "cache", None)
    if cache:
        cache.clear()


def _count(kind: str) -> None:
    casts = getattr(_state, "casts", None)
    if casts is None:
        casts = _state.casts = {"weights": 0, "others": 0}
    casts[kind] += 1


def _cast(t: Any, dtype: Any) -> Any:
    src = None if t is None else t.array.dtype
    eligible = src is not None and (src == numpy.float32 or src in LOW_PRECISION)
    if not eligible or src == dtype:
        return t
    if not (t.requires_grad and t.is_leaf and getattr(_state, "depth", 0) > 0):
        _count("others")
        return t.astype(dtype)
    cache = getattr(_state, "cache", None)
    if cache is None:
        cache = _state.cache = {}
    key = (id(t), dtype, grad_mode.is_grad_enabled())
    hit = cache.get(key)
    if hit is not None and hit[0] is t:  # the tensor itself is kept: its id is not reused
        return hit[1]
    _count("weights")
    out = t.astype(dtype)
    cache[key] = (t, out)
    return out


def autocast_args(op: str, *tensors: Any) -> tuple:
    """``tensors`` cast as ``POLICY[op]`` says when autocast is on for their device; else as is.

    None entries (an absent bias) pass through. The casts are tape ops (``Tensor.astype``), so
    the gradient of a float32 parameter used in a float16 op comes back as float32.
    """
    active = getattr(_state, "active", None)
    if not active:
        return tensors
    first = next(t for t in tensors if t is not None)
    dtype = active.get(device_type_of(first.array))
    if dtype is None:
        return tensors
    if POLICY[op] == LOWER_PRECISION:
        _state.lower_ops = getattr(_state, "lower_ops", 0) + 1
        return tuple(_cast(t, dtype) for t in tensors)
    return tuple(t if t is None or t.array.dtype not in LOW_PRECISION else t.astype(numpy.float32)
                 for t in tensors)
