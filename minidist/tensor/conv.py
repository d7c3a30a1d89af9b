"""2-D convolution, max and average pooling on NCHW tensors, by im2col.

``patches(x)`` copies every kh x kw patch into one array, one strided slice per kernel offset
(kh*kw large copies, much faster in NumPy than gathering a 6-D strided view)::

    x (N, C, H, W) --patches--> P (kh, kw, C, N, Ho, Wo)     Ho = (H + 2p - kh) // s + 1
                                P[i, j] = x[:, :, i::s, j::s] (first Ho x Wo), as (C, N, Ho, Wo)
    conv:  channel-major patches P (C, kh, kw, N, Ho, Wo), so that W's own (O, C, kh, kw)
           layout is the GEMM's: W (O, C*kh*kw) @ P (C*kh*kw, N*Ho*Wo) -> (O, N, Ho, Wo) ->
           NCHW view; backward's grad W = g (O, N*Ho*Wo) @ P^T is then W's gradient in W's
           layout, written by the GEMM straight into W's reserved gradient buffer if any
    pool:  max (or mean) over the kh*kw axis of P; adaptive pooling averages torch's bins

Backward turns patch gradients back into an image with ``col2im``: one strided add per kernel
offset, which also sums overlapping windows. Under autocast the convolution runs in float16
(the products go through ``linalg.mm``, emulated with float32 BLAS on the CPU).
"""

from __future__ import annotations

from typing import Any

from minidist import xp as backend
from minidist.tensor.autocast_mode import autocast_args
from minidist.tensor.grad_destination import adopt_grad, claim_grad_destination
from minidist.tensor.core import Tensor, error
from minidist.tensor.linalg import check_same_dtype, mm, sum_rows


def pair(v: Any, name: str = "value") -> tuple[int, int]:
    """``3 -> (3, 3)``; ``(2, 3)`` stays."""
    if isinstance(v, int):
        return (v, v)
    v = tuple(v)
    if len(v) != 2:
        raise ValueError(error("conv", f"{name} must be an int or a pair, got {v}."))
    return (int(v[0]), int(v[1]))


def pad2d(x: Any, ph: int, pw: int) -> Any:
    """Zero-pad the last two dims (faster than ``xp.pad`` for this one case)."""
    if not ph and not pw:
        return x
    xp = backend.get_array_module(x)
    n, c, h, w = x.shape
    out = xp.zeros((n, c, h + 2 * ph, w + 2 * pw), dtype=x.dtype)
    out[:, :, ph:ph + h, pw:pw + w] = x
    return out


def patches(x: Any, kh: int, kw: int, sh: int, sw: int, channels_first: bool = False) -> Any:
    """All kh x kw patches of a 4-D array, as a new array (kh, kw, C, N, Ho, Wo), or
    (C, kh, kw, N, Ho, Wo) with ``channels_first`` (the layout of a conv weight's (C, kh, kw))."""
    xp = backend.get_array_module(x)
    n, c, h, w = x.shape
    ho, wo = (h - kh) // sh + 1, (w - kw) // sw + 1
    out = xp.empty((c, kh, kw, n, ho, wo) if channels_first else (kh, kw, c, n, ho, wo),
                   dtype=x.dtype)
    for i in range(kh):
        for j in range(kw):
            dst = out[:, i, j] if channels_first else out[i, j]
            dst[...] = x[:, :, i:i + sh * (ho - 1) + 1:sh, j:j + sw * (wo - 1) + 1:sw] \
                .transpose(1, 0, 2, 3)
    return out


def col2im(gp: Any, shape: tuple[int, ...], sh: int, sw: int,
           channels_first: bool = False) -> Any:
    """Sum patch gradients (kh, kw, C, N, Ho, Wo), or (C, kh, kw, N, Ho, Wo) with
    ``channels_first``, back into an image of ``shape`` (N, C, H, W)."""
    xp = backend.get_array_module(gp)
    kh, kw = gp.shape[1:3] if channels_first else gp.shape[:2]
    ho, wo = gp.shape[4:]
    gx = xp.zeros(shape, dtype=gp.dtype)
    for i in range(kh):
        for j in range(kw):
            gx[:, :, i:i + sh * (ho - 1) + 1:sh, j:j + sw * (wo - 1) + 1:sw] += \
                (gp[:, i, j] if channels_first else gp[i, j]).transpose(1, 0, 2, 3)
    return gx


def _out_size(op: str, x: Tensor, kh: int, kw: int, ph: int, pw: int) -> None:
    if x.ndim != 4:
        raise ValueError(error(op, f"expects an NCHW input (4-D), got shape {x.shape}. Add a "
                               "batch dim with x[None] or a channel dim with x[:, None]."))
    if x.shape[2] + 2 * ph < kh or x.shape[3] + 2 * pw < kw:
        raise ValueError(error(op, f"kernel {(kh, kw)} is larger than the (padded) input "
                               f"{(x.shape[2] + 2 * ph, x.shape[3] + 2 * pw)} of shape "
                               f"{x.shape}. Use a smaller kernel or more padding."))


def conv2d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1,
           padding: Any = 0) -> Tensor:
    """2-D cross-correlation (torch's ``F.conv2d``), NCHW.

    Args:
        x: (N, C, H, W).
        weight: (O, C, kh, kw).
        bias: (O,) or None.
        stride: int or (sh, sw).
        padding: zero padding, int or (ph, pw).

    Returns:
        (N, O, Ho, Wo) with ``Ho = (H + 2 ph - kh) // sh + 1``.
    """
    x, weight, bias = autocast_args("conv2d", x, weight, bias)
    check_same_dtype("conv2d", x, weight)
    o, c, kh, kw = weight.shape
    (sh, sw), (ph, pw) = pair(stride, "stride"), pair(padding, "padding")
    _out_size("conv2d", x, kh, kw, ph, pw)
    if x.shape[1] != c:
        raise ValueError(error("conv2d", f"input of shape {x.shape} has {x.shape[1]} channels "
                               f"but the weight of shape {weight.shape} expects {c}. Check "
                               "in_channels."))
    n = x.shape[0]
    xpad = pad2d(x.array, ph, pw)
    cols = patches(xpad, kh, kw, sh, sw, channels_first=True)
    ho, wo = cols.shape[4], cols.shape[5]
    cols = cols.reshape(c * kh * kw, n * ho * wo)
    wmat = weight.array.reshape(o, c * kh * kw)  # W's own (O, C, kh, kw) order: a free view
    out = mm(wmat, cols)
    if bias is not None:
        out += bias.array[:, None]
    out = out.reshape(o, n, ho, wo).transpose(1, 0, 2, 3)  # NCHW view of the (O, N, ...) result
    parents = (x, weight) if bias is None else (x, weight, bias)

    def backward(g: Any) -> tuple:
        g2 = g.transpose(1, 0, 2, 3).reshape(o, n * ho * wo)  # a free view when g is out-shaped
        gx = gw = gb = None
        if weight.requires_grad:
            dest = claim_grad_destination(weight)  # W's reserved buffer (DDP's slot)
            if dest is None:
                gw = adopt_grad(weight, mm(g2, cols.T).reshape(o, c, kh, kw))
            else:  # the GEMM writes it there: no temporary, no copy
                mm(g2, cols.T, out=dest.buffer.reshape(o, c * kh * kw), scale=dest.scale)
                gw = dest.buffer
        if x.requires_grad:
            gcols = mm(wmat.T, g2).reshape(c, kh, kw, n, ho, wo)
            gx = col2im(gcols, xpad.shape, sh, sw, channels_first=True
                        )[:, :, ph:ph + x.shape[2], pw:pw + x.shape[3]]
        if bias is not None and bias.requires_grad:
            dest = claim_grad_destination(bias)
            gb = adopt_grad(bias, sum_rows(g2, axis=1)) if dest is None else sum_rows(
                g2, axis=1, out=dest.buffer, scale=dest.scale)
        return (gx, gw) if bias is None else (gx, gw, gb)

    return Tensor._make(out, parents, backward, "conv2d")


def max_pool2d(x: Tensor, kernel_size: Any, stride: Any = None) -> Tensor:
    """Max over each kernel window (no padding; stride defaults to the kernel size).

    The gradient goes to one winner per window (the first maximum on ties).
    """
    kh, kw = pair(kernel_size, "kernel_size")
    sh, sw = pair(stride if stride is not None else (kh, kw), "stride")
    _out_size("max_pool2d", x, kh, kw, 0, 0)
    xp = backend.get_array_module(x.array)
    p = patches(x.array, kh, kw, sh, sw)
    flat = p.reshape((kh * kw,) + p.shape[2:])  # (kh*kw, C, N, Ho, Wo)
    idx = flat.argmax(axis=0)
    out = flat.max(axis=0).transpose(1, 0, 2, 3)

    def backward(g: Any) -> tuple:
        gt = g.transpose(1, 0, 2, 3)
        onehot = xp.arange(kh * kw).reshape(-1, 1, 1, 1, 1) == idx
        gp = (onehot * gt).astype(g.dtype, copy=False).reshape(p.shape)
        return (col2im(gp, x.array.shape, sh, sw),)

    return Tensor._make(out, (x,), backward, "max_pool2d")


def avg_pool2d(x: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0,
               ceil_mode: bool = False, count_include_pad: bool = True,
               divisor_override: int | None = None) -> Tensor:
    """Mean over each kernel window (torch's ``F.avg_pool2d``), NCHW.

    With ``count_include_pad=True`` (torch's default) the zero padding counts in each window's
    divisor; with False only the real pixels do. ``divisor_override`` replaces the divisor. The
    gradient spreads each output's gradient evenly over its window.
    """
    kh, kw = pair(kernel_size, "kernel_size")
    sh, sw = pair(stride if stride is not None else (kh, kw), "stride")
    ph, pw = pair(padding, "padding")
    if ceil_mode:
        raise ValueError(error("avg_pool2d", "ceil_mode=True is not supported; pad the input "
                               "so the windows fit."))
    if 2 * ph > kh or 2 * pw > kw:
        raise ValueError(error("avg_pool2d", f"padding {(ph, pw)} must be at most half the "
                               f"kernel size {(kh, kw)}, as torch requires."))
    _out_size("avg_pool2d", x, kh, kw, ph, pw)
    xp = backend.get_array_module(x.array)
    padded = pad2d(x.array, ph, pw)
    p = patches(padded, kh, kw, sh, sw)  # (kh, kw, C, N, Ho, Wo)
    if divisor_override:
        div: Any = float(divisor_override)
    elif count_include_pad or not (ph or pw):
        div = float(kh * kw)
    else:  # the number of real pixels in each window, (Ho, Wo)
        ones = pad2d(xp.ones((1, 1) + x.shape[2:], dtype=x.dtype), ph, pw)
        div = patches(ones, kh, kw, sh, sw).sum(axis=(0, 1))[0, 0]
    out = (p.sum(axis=(0, 1)) / div).astype(x.dtype, copy=False).transpose(1, 0, 2, 3)

    def backward(g: Any) -> tuple:
        share = (g.transpose(1, 0, 2, 3) / div).astype(g.dtype, copy=False)  # (C, N, Ho, Wo)
        gp = xp.broadcast_to(share, (kh, kw) + share.shape)
        gx = col2im(gp, padded.shape, sh, sw)
        return (gx[:, :, ph:ph + x.shape[2], pw:pw + x.shape[3]],)

    return Tensor._make(out, (x,), backward, "avg_pool2d")


def adaptive_avg_pool2d(x: Tensor, output_size: Any) -> Tensor:
    """Mean pooling to a fixed output size (torch's ``F.adaptive_avg_pool2d``), NCHW.

    Output cell ``i`` of ``Ho`` averages input rows ``floor(i H / Ho) .. ceil((i+1) H / Ho)``
    (torch's bins, which may overlap); the same for columns. ``output_size`` is an int, a pair,
    or a pair with None (keep that input size). ``(1, 1)`` is global average pooling.
    """
    if x.ndim != 4:
        raise ValueError(error("adaptive_avg_pool2d", f"expects an NCHW input (4-D), got shape "
                               f"{x.shape}."))
    size = (output_size, output_size) if isinstance(output_size, int) else tuple(output_size)
    h, w = x.shape[2:]
    oh, ow = (h if size[0] is None else int(size[0])), (w if size[1] is None else int(size[1]))
    if oh <= 0 or ow <= 0:
        raise ValueError(error("adaptive_avg_pool2d", f"output_size must be positive, got "
                               f"{output_size}."))
    if h % oh == 0 and w % ow == 0:  # equal, disjoint windows: an ordinary average pool
        return avg_pool2d(x, (h // oh, w // ow))
    xp = backend.get_array_module(x.array)
    rows = [(i * h // oh, -(-(i + 1) * h // oh)) for i in range(oh)]
    cols = [(j * w // ow, -(-(j + 1) * w // ow)) for j in range(ow)]
    out = xp.empty(x.shape[:2] + (oh, ow), dtype=x.dtype)
    for i, (r0, r1) in enumerate(rows):
        for j, (c0, c1) in enumerate(cols):
            out[:, :, i, j] = x.array[:, :, r0:r1, c0:c1].mean(axis=(2, 3))

    def backward(g: Any) -> tuple:
        gx = xp.zeros(x.array.shape, dtype=g.dtype)
        for i, (r0, r1) in enumerate(rows):
            for j, (c0, c1) in enumerate(cols):
                gx[:, :, r0:r1, c0:c1] += (g[:, :, i, j] / ((r1 - r0) * (c1 - c0)))[:, :, None,
                                                                                     None]
        return (gx,)

    return Tensor._make(out, (x,), backward, "adaptive_avg_pool2d")
