"""Transposed 2-D convolution (torch's ``F.conv_transpose2d``, ``nn.ConvTranspose2d``), NCHW.

It is the input gradient of ``conv2d`` run forward: every input pixel scatters a weighted
kh x kw patch into the output, patches ``stride`` apart and summed where they overlap::

    x (N, Cin, H, W) --W^T @ x--> cols (Cout, kh, kw, N, H, W) --col2im--> (N, Cout, Hf, Wf)
    Hf = (H - 1) * sh + kh + output_padding;  out = the full image cropped by ``padding``:
    Hout = (H - 1) * sh - 2 * ph + kh + output_padding    (torch's formula)

Backward runs it the other way: the output gradient (zero-padded back to Hf) is cut into
patches (``conv.patches``), and two GEMMs give the input's and the weight's gradients, as
conv2d's forward and weight gradient do.
"""

from __future__ import annotations

from typing import Any

from minidist import xp as backend
from minidist.tensor.autocast_mode import autocast_args
from minidist.tensor.conv import col2im, pair, patches
from minidist.tensor.core import Tensor, error
from minidist.tensor.linalg import check_same_dtype


def conv_transpose2d(input: Tensor, weight: Tensor, bias: Tensor | None = None,  # noqa: A002
                     stride: Any = 1, padding: Any = 0, output_padding: Any = 0,
                     groups: int = 1, dilation: Any = 1) -> Tensor:
    """torch's ``F.conv_transpose2d``: weight (Cin, Cout, kh, kw), bias (Cout,) or None.

    Raises:
        ValueError: not 4-D input, channel mismatch, ``output_padding`` not smaller than the
            stride, or ``groups``/``dilation`` other than 1 (not supported).
    """
    x, weight, bias = autocast_args("conv_transpose2d", input, weight, bias)
    check_same_dtype("conv_transpose2d", x, weight)
    if groups != 1 or pair(dilation, "dilation") != (1, 1):
        raise ValueError(error("conv_transpose2d", f"groups={groups}, dilation={dilation}: only "
                               "groups=1 and dilation=1 are supported."))
    if x.ndim != 4:
        raise ValueError(error("conv_transpose2d", f"expects an NCHW input (4-D), got shape "
                               f"{x.shape}."))
    cin, cout, kh, kw = weight.shape
    if x.shape[1] != cin:
        raise ValueError(error("conv_transpose2d", f"input of shape {x.shape} has "
                               f"{x.shape[1]} channels but the weight of shape {weight.shape} "
                               f"expects {cin}. Check in_channels."))
    (sh, sw), (ph, pw) = pair(stride, "stride"), pair(padding, "padding")
    oph, opw = pair(output_padding, "output_padding")
    if oph >= sh or opw >= sw:
        raise ValueError(error("conv_transpose2d", f"output_padding {(oph, opw)} must be "
                               f"smaller than the stride {(sh, sw)}, as torch requires."))
    n, _, h, w = x.shape
    hf, wf = (h - 1) * sh + kh + oph, (w - 1) * sw + kw + opw
    hout, wout = hf - 2 * ph, wf - 2 * pw
    if hout <= 0 or wout <= 0:
        raise ValueError(error("conv_transpose2d", f"padding {(ph, pw)} leaves no output for "
                               f"input {x.shape} and kernel {(kh, kw)}."))
    xp = backend.get_array_module(x.array)
    xmat = x.array.transpose(1, 0, 2, 3).reshape(cin, n * h * w)
    wmat = weight.array.reshape(cin, cout * kh * kw)
    cols = (wmat.T @ xmat).reshape(cout, kh, kw, n, h, w)
    full = col2im(cols, (n, cout, hf, wf), sh, sw, channels_first=True)
    out = full[:, :, ph:ph + hout, pw:pw + wout]
    if bias is not None:
        out = out + bias.array[None, :, None, None]
    parents = (x, weight) if bias is None else (x, weight, bias)

    def backward(g: Any) -> tuple:
        gfull = xp.zeros((n, cout, hf, wf), dtype=g.dtype)
        gfull[:, :, ph:ph + hout, pw:pw + wout] = g
        gcols = patches(gfull, kh, kw, sh, sw, channels_first=True)[..., :h, :w]
        gcols = gcols.reshape(cout * kh * kw, n * h * w)
        gx = (wmat @ gcols).reshape(cin, n, h, w).transpose(1, 0, 2, 3)
        gw = (xmat @ gcols.T).reshape(cin, cout, kh, kw)
        if bias is None:
            return gx, gw
        return gx, gw, g.sum(axis=(0, 2, 3))

    return Tensor._make(out, parents, backward, "conv_transpose2d")


__all__ = ["conv_transpose2d"]
