"""``autocast``: run matmul/linear/conv in float16 and softmax/losses/reductions in float32.

    from minidist import amp
    with amp.autocast("cpu", dtype=minidist.float16):   # torch's CPU default is bfloat16
        logits = model(x)                     # Linear layers compute in float16
        loss = loss_fn(logits, y)             # cross_entropy computes in float32
    loss.backward()                           # outside: the backward follows the forward's dtypes

The state lives in the tensor layer (``minidist.tensor.autocast_mode``, per thread and per
device type) so that tensor ops can consult it; this class only switches it on and off. See
that module for the op lists and for how the CPU emulates float16 matrix products.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

import numpy

from minidist.logger import rank_prefix
from minidist.tensor import autocast_mode as state
from minidist.tensor import dtypes

F = TypeVar("F", bound=Callable[..., Any])

float16 = dtypes.float16
"""The dtype autocast computes in: ``amp.autocast("cuda", dtype=minidist.float16)``."""


def _check_dtype(device_type: str, dtype: Any) -> Any:
    if dtype is None:  # torch's defaults: float16 on a GPU, bfloat16 on the CPU
        dtype = numpy.float16 if device_type == "cuda" else dtypes.BFLOAT16_NUMPY
    elif isinstance(dtype, str) and dtype == "bfloat16":  # NumPy knows the name only once
        dtype = dtypes.BFLOAT16_NUMPY  # ml_dtypes is imported, which this does (dtypes.py)
    try:
        dt = numpy.dtype(dtype)
    except TypeError:
        dt = None
    if dt not in state.SUPPORTED_DTYPES:
        raise ValueError(f"{rank_prefix()} autocast: dtype={dtype!r} is not supported; use "
                         "dtype=minidist.float16 (or minidist.bfloat16 on the CPU).")
    if dt != numpy.float16 and device_type == "cuda":
        raise ValueError(f"{rank_prefix()} autocast('cuda', dtype={dtype!r}): CuPy has no "
                         "bfloat16 arrays; use dtype=minidist.float16 on a GPU.")
    return dt


class autocast:  # noqa: N801 - torch's name
    """Context manager (and decorator) that runs eligible ops in lower precision in its block.

    torch.autocast's signature and op policy (see ``minidist.tensor.autocast_mode``): matmul,
    linear and conv2d cast float32 inputs to float16; softmax, log_softmax, cross_entropy,
    mse_loss, layer_norm, exp, log, pow and sum cast float16 inputs to float32; other ops run
    in the dtype of their inputs. Blocks nest; each restores the previous state in ``finally``
    (``enabled=False`` turns autocast off inside an enclosing block).

    Run only the forward pass (and the loss) under autocast, not ``backward()``: the tape
    already records the casts, and the gradient of a float32 parameter comes back float32.

    On the CPU the float16 products are EMULATED (float32 BLAS, results rounded to float16),
    so values, overflow and rounding match a GPU's float16 GEMM but nothing runs faster.

    Args:
        device_type: "cpu" (NumPy arrays) or "cuda" (CuPy arrays): ops on arrays of the other
            device are left alone, as in torch.
        dtype: the lower-precision dtype: float16, or on the CPU bfloat16 (``ml_dtypes``;
            its products are emulated with float32 BLAS as float16's are). None (the
            default) is torch's: float16 for "cuda", bfloat16 for "cpu"; pass
            ``dtype=minidist.float16`` for float16 on the CPU.
        enabled: False makes the block a no-op (or turns autocast off inside another block).

    Attributes:
        lower_precision_ops: after the block, how many ops in it ran in float16 (0 means the
            model has no float16 path: nothing was cast).
    """

    def __init__(self, device_type: str, dtype: Any = None, enabled: bool = True,
                 cache_enabled: Any = None) -> None:
        if device_type not in state.DEVICE_TYPES:
            raise ValueError(f"{rank_prefix()} autocast: device_type={device_type!r}; use one "
                             f"of {state.DEVICE_TYPES}.")
        self.device_type = device_type
        self.fast_dtype = _check_dtype(device_type, dtype)
        self.enabled = bool(enabled)
        self.lower_precision_ops = 0
        self._prev: list[Any] = []
        self._count0: list[int] = []

    def __enter__(self) -> autocast:
        new = self.fast_dtype if self.enabled else None
        self._prev.append(state.set_autocast_dtype(self.device_type, new))
        self._count0.append(state.lower_precision_op_count())
        state.enter_region()  # the cast cache lives until the outermost region exits
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            state.set_autocast_dtype(self.device_type, self._prev.pop())
            self.lower_precision_ops = state.lower_precision_op_count() - self._count0.pop()
        finally:
            state.exit_region()

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with autocast(self.device_type, self.fast_dtype, self.enabled):  # a fresh one per
                return fn(*args, **kwargs)                                   # call: reentrant

        return wrapper  # type: ignore[return-value]


def is_autocast_enabled(device_type: str = "cpu") -> bool:
    """True inside an enabled ``autocast(device_type)`` block on this thread."""
    return state.is_autocast_enabled(device_type)


def get_autocast_dtype(device_type: str = "cpu") -> Any:
    """The dtype of the enclosing ``autocast(device_type)`` block, or None outside one."""
    return state.get_autocast_dtype(device_type)
