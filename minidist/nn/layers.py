"""The main job's layers, with torch's names, shapes and default init: Linear, ReLU, Dropout,
Flatten, Identity and the container Sequential.

torch's other layers are beside this file and importable from it too: the activations
(LeakyReLU, GELU, Tanh, Sigmoid, Softmax, LogSoftmax) in ``activations.py``; LayerNorm, Dropout2d,
Embedding in ``norm_dropout_embedding.py``; ModuleList, ModuleDict in ``containers.py``.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any, Iterator

import numpy

from minidist import xp as backend
from minidist.nn import init
from minidist.nn.module import Module, Parameter
from minidist.tensor import Tensor, dropout, linear
from minidist.tensor.core import error


def empty_parameter(*shape: int, dtype: Any = numpy.float32) -> Parameter:
    """A zero-filled Parameter on the default device (init fills it)."""
    return Parameter(backend.default_array_module().zeros(shape, dtype=dtype))


def factory_dtype(dtype: Any) -> numpy.dtype:
    """torch's ``dtype=None`` on a layer: the default float32; else that (float) dtype."""
    return numpy.dtype(numpy.float32 if dtype is None else dtype)


def place(module: Module, device: Any) -> None:
    """torch's ``device=`` on a layer: move its freshly initialised parameters and buffers
    there (in place; draws happen on the host first, so a seed gives the same weights)."""
    if device is not None:
        module.to(device)


class Linear(Module):
    """``y = x @ weight.T + bias`` with weight (out_features, in_features), as torch.

    Init as torch: weight and bias ~ U(-1/sqrt(in_features), 1/sqrt(in_features)).
    ``device=``/``dtype=`` as torch: where and in which float dtype the parameters live.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        dtype = factory_dtype(dtype)
        self.in_features, self.out_features = in_features, out_features
        self.weight = empty_parameter(out_features, in_features, dtype=dtype)
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))  # torch's default
        if bias:
            self.bias = empty_parameter(out_features, dtype=dtype)
            bound = 1.0 / math.sqrt(in_features) if in_features > 0 else 0.0
            init.uniform_(self.bias, -bound, bound)
        else:
            self.bias = None
        place(self, device)

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")


class Dropout(Module):
    """Inverted dropout with probability ``p`` in training mode; the identity in eval mode.

    ``inplace=True`` is accepted, as torch's; the result is computed out of place (the tape
    keeps the input for the backward pass), which gives the same values.
    """

    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(error("Dropout", f"p must be in [0, 1], got {p}."))
        self.p, self.inplace = p, inplace

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}, inplace={self.inplace}" if self.inplace else f"p={self.p}"


class Flatten(Module):
    """Flatten dims ``start_dim..`` (default 1: keep the batch dim)."""

    def __init__(self, start_dim: int = 1) -> None:
        super().__init__()
        self.start_dim = start_dim

    def forward(self, x: Tensor) -> Tensor:
        return x.flatten(self.start_dim)


class ReLU(Module):
    """``max(x, 0)``; ``inplace=True`` is accepted (computed out of place, same values)."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, x: Tensor) -> Tensor:
        return x.relu()

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""

class Identity(Module):
    def forward(self, x: Tensor) -> Tensor:
        return x


class Sequential(Module):
    """Modules applied in order; children are named "0", "1", ... (or by an OrderedDict)."""

    def __init__(self, *layers: Module | OrderedDict[str, Module]) -> None:
        super().__init__()
        if len(layers) == 1 and isinstance(layers[0], OrderedDict):
            for name, layer in layers[0].items():
                setattr(self, name, layer)
        else:
            for i, layer in enumerate(layers):
                if not isinstance(layer, Module):
                    raise TypeError(error("Sequential", f"argument {i} is a "
                                          f"{type(layer).__name__}, not a Module."))
                setattr(self, str(i), layer)

    def forward(self, x: Any) -> Any:
        for layer in self._modules.values():
            x = layer(x)
        return x

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def __getitem__(self, index: int | slice) -> Module:
        layers = list(self._modules.values())
        if isinstance(index, slice):
            return Sequential(*layers[index])
        if not -len(layers) <= index < len(layers):
            raise IndexError(error("Sequential", f"index {index} is out of range for "
                                   f"{len(layers)} layers."))
        return layers[index]

    def append(self, layer: Module) -> Sequential:
        setattr(self, str(len(self._modules)), layer)
        return self


# torch's other layers, importable from here as before (they import this module's helpers)
from minidist.nn.activations import (GELU, LeakyReLU, LogSoftmax, Sigmoid,  # noqa: E402,F401
                                     Softmax, Tanh)
from minidist.nn.containers import ModuleDict, ModuleList  # noqa: E402,F401
from minidist.nn.norm_dropout_embedding import Dropout2d, Embedding, LayerNorm  # noqa: E402,F401
