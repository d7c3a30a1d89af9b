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

import numpy

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


def patches(x: Any, kh: int, kw: int, sh: int, sw: int, channels_first: bool = False,
            dh: int = 1, dw: int = 1) -> Any:
    """All kh x kw patches of a 4-D array, as a new array (kh, kw, C, N, Ho, Wo), or
    (C, kh, kw, N, Ho, Wo) with ``channels_first`` (the layout of a conv weight's (C, kh, kw)).
    With dilation ``(dh, dw)`` the kernel's taps are that many pixels apart."""
    xp = backend.get_array_module(x)
    n, c, h, w = x.shape
    ho, wo = (h - dh * (kh - 1) - 1) // sh + 1, (w - dw * (kw - 1) - 1) // sw + 1
    out = xp.empty((c, kh, kw, n, ho, wo) if channels_first else (kh, kw, c, n, ho, wo),
                   dtype=x.dtype)
    for i in range(kh):
        for j in range(kw):
            dst = out[:, i, j] if channels_first else out[i, j]
            r, q = i * dh, j * dw
            dst[...] = x[:, :, r:r + sh * (ho - 1) + 1:sh, q:q + sw * (wo - 1) + 1:sw] \
                .transpose(1, 0, 2, 3)
    return out


def col2im(gp: Any, shape: tuple[int, ...], sh: int, sw: int,
           channels_first: bool = False, dh: int = 1, dw: int = 1) -> Any:
    """Sum patch gradients (kh, kw, C, N, Ho, Wo), or (C, kh, kw, N, Ho, Wo) with
    ``channels_first``, back into an image of ``shape`` (N, C, H, W) (``patches`` reversed)."""
    xp = backend.get_array_module(gp)
    kh, kw = gp.shape[1:3] if channels_first else gp.shape[:2]
    ho, wo = gp.shape[4:]
    gx = xp.zeros(shape, dtype=gp.dtype)
    for i in range(kh):
        for j in range(kw):
            r, q = i * dh, j * dw
            gx[:, :, r:r + sh * (ho - 1) + 1:sh, q:q + sw * (wo - 1) + 1:sw] += \
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
                dest.write(mm, g2, cols.T, out=dest.buffer.reshape(o, c * kh * kw))
                gw = dest.buffer
        if x.requires_grad:
            gcols = mm(wmat.T, g2).reshape(c, kh, kw, n, ho, wo)
            gx = col2im(gcols, xpad.shape, sh, sw, channels_first=True
                        )[:, :, ph:ph + x.shape[2], pw:pw + x.shape[3]]
        if bias is not None and bias.requires_grad:
            dest = claim_grad_destination(bias)
            gb = adopt_grad(bias, sum_rows(g2, axis=1)) if dest is None else dest.write(
                sum_rows, g2.T)  # axis 0 of the transpose: the same sums
        return (gx, gw) if bias is None else (gx, gw, gb)

    return Tensor._make(out, parents, backward, "conv2d")


def pool_out_size(op: str, size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """torch's pooling output length: ``(size + 2p - d(k-1) - 1) / s + 1``, rounded down (or
    up with ``ceil_mode``, where a last window that would start in the right padding is
    dropped)."""
    span = size + 2 * p - d * (k - 1) - 1
    if span < 0:
        raise ValueError(error(op, f"kernel {k} (dilation {d}) is larger than the padded input "
                               f"length {size + 2 * p}. Use a smaller kernel or more padding."))
    out = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def max_pool2d(x: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0,
               dilation: Any = 1, ceil_mode: bool = False, return_indices: bool = False
               ) -> Tensor:
    """Max over each kernel window (torch's ``F.max_pool2d``; stride defaults to the kernel).

    ``padding`` pads with -inf (at most half the kernel, as torch), so a padded pixel never
    wins; ``dilation`` spaces the kernel's taps; ``ceil_mode`` rounds the output size up (the
    extra windows hang over the bottom/right edge). The gradient goes to one winner per window
    (the first maximum on ties).
    """
    kh, kw = pair(kernel_size, "kernel_size")
    sh, sw = pair(stride if stride is not None and stride != [] else (kh, kw), "stride")
    (ph, pw), (dh, dw) = pair(padding, "padding"), pair(dilation, "dilation")
    if return_indices:
        raise ValueError(error("max_pool2d", "return_indices=True is not supported."))
    if 2 * ph > kh or 2 * pw > kw:
        raise ValueError(error("max_pool2d", f"padding {(ph, pw)} must be at most half the "
                               f"kernel size {(kh, kw)}, as torch requires."))
    if x.ndim != 4:
        raise ValueError(error("max_pool2d", f"expects an NCHW input (4-D), got shape "
                               f"{x.shape}. Add a batch dim with x[None]."))
    xp = backend.get_array_module(x.array)
    h, w = x.shape[2:]
    ho = pool_out_size("max_pool2d", h, kh, sh, ph, dh, ceil_mode)
    wo = pool_out_size("max_pool2d", w, kw, sw, pw, dw, ceil_mode)
    # the padded image the windows read: -inf around x, as far as the last window reaches
    hp, wp = (ho - 1) * sh + dh * (kh - 1) + 1, (wo - 1) * sw + dw * (kw - 1) + 1
    full = x.shape[:2] + (max(hp, h + ph), max(wp, w + pw))
    padded = x.array
    if (ph, pw) != (0, 0) or (hp, wp) != (h, w):
        low = -xp.inf if xp.issubdtype(x.dtype, xp.floating) else xp.iinfo(x.dtype).min
        padded = xp.full(full, low, dtype=x.dtype)
        padded[:, :, ph:ph + h, pw:pw + w] = x.array
        padded = padded[:, :, :hp, :wp]  # rows no window reaches are left out
    p = patches(padded, kh, kw, sh, sw, dh=dh, dw=dw)
    flat = p.reshape((kh * kw,) + p.shape[2:])  # (kh*kw, C, N, Ho, Wo)
    idx = flat.argmax(axis=0)
    out = flat.max(axis=0).transpose(1, 0, 2, 3)

    def backward(g: Any) -> tuple:
        gt = g.transpose(1, 0, 2, 3)
        onehot = xp.arange(kh * kw).reshape(-1, 1, 1, 1, 1) == idx
        gp = (onehot * gt).astype(g.dtype, copy=False).reshape(p.shape)
        gx = xp.zeros(full, dtype=g.dtype)
        gx[:, :, :hp, :wp] = col2im(gp, padded.shape, sh, sw, dh=dh, dw=dw)
        return (gx[:, :, ph:ph + h, pw:pw + w],)

    return Tensor._make(out, (x,), backward, "max_pool2d")


def window_counts(size: int, k: int, s: int, p: int, out: int, count_pad: bool) -> list[int]:
    """Per output position, how many of a window's k taps count in torch's divisor: the taps
    inside input + padding (``count_pad``), or inside the input only; a ``ceil_mode`` window
    that hangs past the padding counts only what it covers."""
    counts = []
    for i in range(out):
        lo, hi = i * s - p, min(i * s - p + k, size + p)
        counts.append(hi - lo if count_pad else min(hi, size) - max(lo, 0))
    return counts


def avg_pool2d(x: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0,
               ceil_mode: bool = False, count_include_pad: bool = True,
               divisor_override: int | None = None) -> Tensor:
    """Mean over each kernel window (torch's ``F.avg_pool2d``), NCHW.

    With ``count_include_pad=True`` (torch's default) the zero padding counts in each window's
    divisor; with False only the real pixels do. ``ceil_mode`` rounds the output size up, as in
    ``max_pool2d``; a window hanging past the padding divides by what it covers (torch's rule).
    ``divisor_override`` replaces the divisor. The gradient spreads each output's gradient
    evenly over its window.
    """
    kh, kw = pair(kernel_size, "kernel_size")
    sh, sw = pair(stride if stride is not None else (kh, kw), "stride")
    ph, pw = pair(padding, "padding")
    if 2 * ph > kh or 2 * pw > kw:
        raise ValueError(error("avg_pool2d", f"padding {(ph, pw)} must be at most half the "
                               f"kernel size {(kh, kw)}, as torch requires."))
    _out_size("avg_pool2d", x, kh, kw, ph, pw)
    xp = backend.get_array_module(x.array)
    h, w = x.shape[2:]
    ho = pool_out_size("avg_pool2d", h, kh, sh, ph, 1, ceil_mode)
    wo = pool_out_size("avg_pool2d", w, kw, sw, pw, 1, ceil_mode)
    hp, wp = (ho - 1) * sh + kh, (wo - 1) * sw + kw  # what the windows read (zeros around x)
    full = x.shape[:2] + (max(hp, h + ph), max(wp, w + pw))
    if (ph, pw) == (0, 0) and hp <= h and wp <= w:
        padded = x.array[:, :, :hp, :wp]  # no padding: a view
    else:
        padded = xp.zeros(full, dtype=x.dtype)
        padded[:, :, ph:ph + h, pw:pw + w] = x.array
        padded = padded[:, :, :hp, :wp]
    p = patches(padded, kh, kw, sh, sw)  # (kh, kw, C, N, Ho, Wo)
    if divisor_override:
        div: Any = float(divisor_override)
    else:
        rows = window_counts(h, kh, sh, ph, ho, count_include_pad)
        cols = window_counts(w, kw, sw, pw, wo, count_include_pad)
        div = xp.asarray(numpy.outer(rows, cols), dtype=x.dtype)  # (Ho, Wo)
    out = (p.sum(axis=(0, 1)) / div).astype(x.dtype, copy=False).transpose(1, 0, 2, 3)

    def backward(g: Any) -> tuple:
        share = (g.transpose(1, 0, 2, 3) / div).astype(g.dtype, copy=False)  # (C, N, Ho, Wo)
        gp = xp.broadcast_to(share, (kh, kw) + share.shape)
        gx = xp.zeros(full, dtype=g.dtype)
        gx[:, :, :hp, :wp] = col2im(gp, padded.shape, sh, sw)
        return (gx[:, :, ph:ph + h, pw:pw + w],)

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
