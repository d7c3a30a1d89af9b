"""Convolution and pooling layers on NCHW tensors: ``Conv2d``, ``ConvTranspose2d``,
``MaxPool2d``, ``AvgPool2d``, ``AdaptiveAvgPool2d`` (torch's signatures and init).

    net = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Flatten(), nn.Linear(16 * 4 * 4, 10))     # for 8x8 images
"""

from __future__ import annotations

import math
from typing import Any


from minidist.nn import init
from minidist.nn.layers import empty_parameter, factory_dtype, place
from minidist.nn.module import Module
from minidist.tensor import Tensor, adaptive_avg_pool2d, avg_pool2d, conv2d, max_pool2d
from minidist.tensor.conv import pair
from minidist.tensor.conv_transpose import conv_transpose2d
from minidist.tensor.core import error



def only_plain_options(layer: str, dilation: Any, groups: int, padding_mode: str) -> None:
    """The convolution options minidist does not implement: a clear error, not a wrong layer."""
    if pair(dilation, "dilation") != (1, 1) or groups != 1 or padding_mode != "zeros":
        raise ValueError(error(layer, f"dilation={dilation}, groups={groups}, "
                               f"padding_mode={padding_mode!r}: only dilation=1, groups=1 "
                               "and padding_mode='zeros' are supported."))

class Conv2d(Module):
    """2-D convolution: weight (out_channels, in_channels, kh, kw), bias (out_channels,).

    Init as torch: weight and bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = in*kh*kw.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any = 1,
                 padding: Any = 0, dilation: Any = 1, groups: int = 1, bias: bool = True,
                 padding_mode: str = "zeros", device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        dtype = factory_dtype(dtype)
        only_plain_options("Conv2d", dilation, groups, padding_mode)
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size = pair(kernel_size, "kernel_size")
        self.stride, self.padding = pair(stride, "stride"), pair(padding, "padding")
        self.weight = empty_parameter(out_channels, in_channels, *self.kernel_size, dtype=dtype)
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))  # torch's default
        if bias:
            self.bias = empty_parameter(out_channels, dtype=dtype)
            bound = 1.0 / math.sqrt(init.fan_in(self.weight))
            init.uniform_(self.bias, -bound, bound)
        else:
            self.bias = None
        place(self, device)

    def forward(self, x: Tensor) -> Tensor:
        return conv2d(x, self.weight, self.bias, self.stride, self.padding)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}")


class ConvTranspose2d(Module):
    """Transposed 2-D convolution (torch's ``nn.ConvTranspose2d``): weight (in_channels,
    out_channels, kh, kw), bias (out_channels,); output size ``(H - 1) * stride - 2 * padding
    + kernel_size + output_padding``, as torch.

    Init as torch: weight and bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with torch's fan_in
    of this weight layout, out_channels*kh*kw. ``groups`` and ``dilation`` must stay 1.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any = 1,
                 padding: Any = 0, output_padding: Any = 0, groups: int = 1, bias: bool = True,
                 dilation: Any = 1, padding_mode: str = "zeros", device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        dtype = factory_dtype(dtype)
        only_plain_options("ConvTranspose2d", dilation, groups, padding_mode)
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size = pair(kernel_size, "kernel_size")
        self.stride, self.padding = pair(stride, "stride"), pair(padding, "padding")
        self.output_padding = pair(output_padding, "output_padding")
        self.weight = empty_parameter(in_channels, out_channels, *self.kernel_size, dtype=dtype)
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))  # torch's default
        if bias:
            self.bias = empty_parameter(out_channels, dtype=dtype)
            bound = 1.0 / math.sqrt(init.fan_in(self.weight))
            init.uniform_(self.bias, -bound, bound)
        else:
            self.bias = None
        place(self, device)

    def forward(self, x: Tensor, output_size: Any = None) -> Tensor:
        if output_size is not None:
            raise ValueError(error("ConvTranspose2d", "output_size= is not supported; set "
                                   "output_padding in the constructor instead."))
        return conv_transpose2d(x, self.weight, self.bias, self.stride, self.padding,
                                self.output_padding)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}")


class MaxPool2d(Module):
    """Max over kernel windows (torch's ``nn.MaxPool2d(kernel_size, stride=None, padding=0,
    dilation=1, return_indices=False, ceil_mode=False)``; stride defaults to the kernel size).

    ``MaxPool2d(3, 2, padding=1)`` is torchvision's ResNet stem: the padding is -inf, so it
    never wins a window.
    """

    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0,
                 dilation: Any = 1, return_indices: bool = False,
                 ceil_mode: bool = False) -> None:
        super().__init__()
        if return_indices:
            raise ValueError(error("MaxPool2d", "return_indices=True is not supported."))
        self.kernel_size = pair(kernel_size, "kernel_size")
        self.stride = pair(stride, "stride") if stride is not None else self.kernel_size
        self.padding, self.dilation = pair(padding, "padding"), pair(dilation, "dilation")
        self.return_indices, self.ceil_mode = return_indices, ceil_mode

    def forward(self, x: Tensor) -> Tensor:
        return max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation,
                          self.ceil_mode)

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}, ceil_mode={self.ceil_mode}")


class AvgPool2d(Module):
    """Mean over kernel windows (torch's ``nn.AvgPool2d``; stride defaults to the kernel size).

    ``count_include_pad=True`` (default) counts the zero padding in each divisor;
    ``ceil_mode=True`` rounds the output size up, as torch.
    """

    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0,
                 ceil_mode: bool = False, count_include_pad: bool = True,
                 divisor_override: int | None = None) -> None:
        super().__init__()
        self.kernel_size = pair(kernel_size, "kernel_size")
        self.stride = pair(stride, "stride") if stride is not None else self.kernel_size
        self.padding, self.ceil_mode = pair(padding, "padding"), ceil_mode
        self.count_include_pad, self.divisor_override = count_include_pad, divisor_override

    def forward(self, x: Tensor) -> Tensor:
        return avg_pool2d(x, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                          self.count_include_pad, self.divisor_override)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AdaptiveAvgPool2d(Module):
    """Average-pool to ``output_size`` (int, pair, or pair with None = keep that size);
    ``AdaptiveAvgPool2d(1)`` is global average pooling."""

    def __init__(self, output_size: Any) -> None:
        super().__init__()
        self.output_size = output_size

    def forward(self, x: Tensor) -> Tensor:
        return adaptive_avg_pool2d(x, self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"
