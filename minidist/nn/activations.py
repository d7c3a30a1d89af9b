"""torch's other activation layers: LeakyReLU, GELU, Tanh, Sigmoid, Softmax, LogSoftmax.

The main job's activation, ``ReLU``, is in ``minidist/nn/layers.py``; these are the same kind
of layer (no parameters, one tensor op in ``forward``) and are also importable from there
(``nn.layers.GELU``) and, as in torch, from ``nn`` and ``nn.modules.activation``.
"""

from __future__ import annotations

from minidist.nn.module import Module
from minidist.tensor import Tensor, gelu, log_softmax, sigmoid, softmax, tanh
from minidist.tensor.nn_ops import leaky_relu


class LeakyReLU(Module):
    """``x`` where positive, ``negative_slope * x`` elsewhere (torch's ``nn.LeakyReLU``);
    ``inplace=True`` is accepted (computed out of place, same values)."""

    def __init__(self, negative_slope: float = 0.01, inplace: bool = False) -> None:
        super().__init__()
        self.negative_slope, self.inplace = negative_slope, inplace

    def forward(self, x: Tensor) -> Tensor:
        return leaky_relu(x, self.negative_slope)

    def extra_repr(self) -> str:
        return f"negative_slope={self.negative_slope}" + (", inplace=True" if self.inplace
                                                          else "")


class GELU(Module):
    """GELU; ``approximate="none"`` (exact erf form, torch's default) or ``"tanh"``."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        self.approximate = approximate

    def forward(self, x: Tensor) -> Tensor:
        return gelu(x, self.approximate)


class Tanh(Module):
    def forward(self, x: Tensor) -> Tensor:
        return tanh(x)


class Sigmoid(Module):
    def forward(self, x: Tensor) -> Tensor:
        return sigmoid(x)


class Softmax(Module):
    """``softmax`` along ``dim`` (torch's ``nn.Softmax(dim)``)."""

    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: Tensor) -> Tensor:
        return softmax(x, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class LogSoftmax(Softmax):
    """``log_softmax`` along ``dim`` (pair it with ``NLLLoss``)."""

    def forward(self, x: Tensor) -> Tensor:
        return log_softmax(x, self.dim)
