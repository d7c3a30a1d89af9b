"""Matrix products: ``matmul`` (1-D, 2-D, batched, as ``numpy.matmul``) and fused ``linear``.

For ``out = a @ b`` with ``a (..., n, k)`` and ``b (..., k, m)``::

    grad a = g @ b^T     (..., n, k)       summed over broadcast batch dims
    grad b = a^T @ g     (..., k, m)

A 1-D left operand acts as a row ``(1, k)``, a 1-D right one as a column ``(k, 1)``; the added
dim is dropped from the result and from the gradients. ``linear(x, W, b) = x @ W^T + b`` is one
node, so its backward writes ``grad W = g^T @ x`` directly in W's (out, in) layout: into W's
reserved gradient buffer when it has one (``grad_destination.write_leaf_grad``: a DDP bucket
slot), as the GEMM's own output, with no copy; the bias gradient is summed into its slot too.

Under autocast (``autocast_mode``) all three run in float16; every product goes through ``mm``
(float16 on the CPU: emulated with float32 BLAS) and bias gradients through ``sum_rows``.
"""

from __future__ import annotations

from typing import Any

import numpy

from minidist import xp as backend
from minidist.tensor.autocast_mode import autocast_args
from minidist.tensor import dtypes
from minidist.tensor.core import Tensor, error, is_floating
from minidist.tensor import deterministic
from minidist.tensor.deterministic import OFF
from minidist.tensor.elementwise import broadcast_message, unbroadcast
from minidist.tensor.grad_destination import write_leaf_grad

LOW_PRECISION = dtypes.HALF
"""The 16-bit floats whose CPU products are emulated with float32 BLAS (see ``mm``)."""


def mm(a: Any, b: Any, out: Any = None) -> Any:
    """``a @ b`` on xp arrays, into ``out`` if given (then returns ``out``): for 2-D operands,
    ``out`` (a C-contiguous array, e.g. a gradient bucket slot) receives the product as the
    GEMM's own output, with no temporary; another dtype than the product's is cast on the way.

    float16 @ float16 on the CPU is computed in float32 and rounded: NumPy multiplies float16
    matrices without BLAS (far slower than float32). The emulation widens both operands
    exactly, uses float32 BLAS (float32 accumulation, like a device's half-precision GEMM) and
    rounds the product to float16, overflowing to inf where a device would. On a GPU, CuPy runs
    the real float16 GEMM.
    """
    xp = backend.get_array_module(a, b)
    # (itemsize first: a float32 GEMM, the common case, asks LOW_PRECISION nothing)
    if a.dtype.itemsize == 2 and a.dtype in LOW_PRECISION and b.dtype == a.dtype and \
            xp is numpy:  # bfloat16 alike
        with numpy.errstate(over="ignore", invalid="ignore"):  # inf, NaN: as on a device
            prod = numpy.matmul(a.astype(numpy.float32), b.astype(numpy.float32))
            if out is None:
                return prod.astype(a.dtype)
            numpy.copyto(out, prod, casting="unsafe")
            return out
    math = xp if deterministic.state is OFF else deterministic.array_math(xp)
    if out is None:
        return math.matmul(a, b)
    if out.dtype == xp.result_type(a, b):
        math.matmul(a, b, out=out)
    else:
        xp.copyto(out, math.matmul(a, b), casting="unsafe")
    return out


def sum_rows(g: Any, axis: int = 0, out: Any = None) -> Any:
    """``g.sum(axis)``, into ``out`` if given; float16 is accumulated in float32 and rounded
    once (bias gradients)."""
    if g.dtype.itemsize == 2 and g.dtype in LOW_PRECISION:
        s = g.sum(axis=axis, dtype=numpy.float32)
        if out is None:
            return s.astype(g.dtype)
        backend.get_array_module(g).copyto(out, s, casting="unsafe")
        return out
    return g.sum(axis=axis, out=out)


def _check_aligned(op: str, a: tuple[int, ...], b: tuple[int, ...]) -> None:
    if not a or not b:
        raise ValueError(error(op, f"shapes {a} and {b}: matmul needs at least 1-D operands. "
                               "Use * for scalars."))
    ka, kb = a[-1], (b[-2] if len(b) >= 2 else b[0])
    if ka != kb:
        da, db = len(a) - 1, (len(b) - 2 if len(b) >= 2 else 0)
        raise ValueError(error(op, f"shapes {a} and {b} are not aligned: {ka} (dim {da} of the "
                               f"left) != {kb} (dim {db} of the right). The inner dimensions "
                               "must match: transpose one side (.T) or check the layer sizes."))


def check_same_dtype(op: str, x: Tensor, weight: Tensor) -> None:
    """A float64 input to a float32 (or float16) layer is an error, as torch's "mat1 and mat2
    must have the same dtype": NumPy would silently promote, and a float64 batch (NumPy's
    default) would run a float32 model in float64. Narrower inputs keep NumPy's promotion (a
    float32 batch into a float16 model with float32 masters, docs/amp.md)."""
    xd, wd = x.array.dtype, weight.array.dtype
    if xd == numpy.float64 and wd != numpy.float64 and is_floating(wd):
        raise TypeError(error(op, f"input dtype {xd} differs from weight dtype "
                              f"{wd} (torch: mat1 and mat2 must have the same dtype). "
                              f"Cast the input (x.float(), array.astype(numpy.{wd})) "
                              "or the model (.double()), or run under autocast."))


def matmul(a: Tensor, b: Any) -> Tensor:
    """``a @ b`` with NumPy's matmul rules."""
    if not isinstance(b, Tensor):
        b = Tensor(b, dtype=a.dtype)
    a, b = autocast_args("matmul", a, b)
    _check_aligned("matmul", a.shape, b.shape)
    xp = backend.get_array_module(a.array, b.array)
    try:
        out = mm(a.array, b.array)
    except ValueError:
        raise ValueError(broadcast_message("matmul (batch dims)", a.shape[:-2],
                                           b.shape[:-2])) from None

    def backward(g: Any) -> tuple:
        A, B = a.array, b.array
        if A.ndim == 1 and B.ndim == 1:
            return (g * B if a.requires_grad else None), (g * A if b.requires_grad else None)
        A2 = A[None, :] if A.ndim == 1 else A
        B2 = B[:, None] if B.ndim == 1 else B
        g2 = g[..., None, :] if A.ndim == 1 else (g[..., None] if B.ndim == 1 else g)
        ga = gb = None
        plain = A.ndim == 2 and B.ndim == 2  # one GEMM per gradient: may go to a destination
        if a.requires_grad and plain:
            ga = write_leaf_grad(a, mm, g, B.T)
        elif a.requires_grad:
            ga = unbroadcast(mm(g2, xp.swapaxes(B2, -1, -2)), A2.shape).reshape(A.shape)
        if b.requires_grad and plain:
            gb = write_leaf_grad(b, mm, A.T, g)
        elif b.requires_grad:
            gb = unbroadcast(mm(xp.swapaxes(A2, -1, -2), g2), B2.shape).reshape(B.shape)
        return ga, gb

    return Tensor._make(out, (a, b), backward, "matmul")


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x @ weight.T + bias`` as one node (torch's ``F.linear``; weight is (out, in)).

    Args:
        x: input of shape (..., in_features).
        weight: (out_features, in_features).
        bias: (out_features,) or None.
    """
    if weight.ndim != 2 or x.ndim == 0 or x.shape[-1] != weight.shape[1]:
        raise ValueError(error(
            "linear", f"input of shape {x.shape} has {x.shape[-1] if x.ndim else 0} features in "
            f"its last dim but the weight of shape {weight.shape} expects {weight.shape[-1]} "
            "(weight is (out_features, in_features)). Check in_features of the layer or the "
            "shape of the input (flatten images first)."))
    x, weight, bias = autocast_args("linear", x, weight, bias)
    check_same_dtype("linear", x, weight)
    out = mm(x.array, weight.array.T)
    if bias is not None:
        out += bias.array  # `out` is a fresh array: add in place, no temporary
    parents = (x, weight) if bias is None else (x, weight, bias)

    def backward(g: Any) -> tuple:  # gradients of x, W (into its slot) and b (into its slot)
        g2 = g.reshape(-1, g.shape[-1])
        x2 = x.array.reshape(-1, x.shape[-1])
        gx = mm(g, weight.array) if x.requires_grad else None
        gw = write_leaf_grad(weight, mm, g2.T, x2) if weight.requires_grad else None
        gb = write_leaf_grad(bias, sum_rows, g2) if bias is not None and bias.requires_grad \
            else None
        return (gx, gw) if bias is None else (gx, gw, gb)

    return Tensor._make(out, parents, backward, "linear")
