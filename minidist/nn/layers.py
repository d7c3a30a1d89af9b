"""Layers with torch's names, shapes and default init: Linear, LayerNorm, Dropout, Dropout2d,
Flatten, Embedding, activations (ReLU, GELU, Tanh, Sigmoid, Softmax, LogSoftmax), Identity and
the containers Sequential, ModuleList, ModuleDict.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any, Iterable, Iterator, Mapping

import numpy

from minidist import xp as backend
from minidist.nn import init
from minidist.nn.module import Module, Parameter
from minidist.tensor import (Tensor, dropout, dropout2d, embedding, layer_norm, linear,
                             log_softmax, softmax)
from minidist.tensor.core import error
from minidist.tensor.nn_ops import leaky_relu


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


class LayerNorm(Module):
    """Normalize over the trailing ``normalized_shape`` dims; keys ``weight`` (ones), ``bias``
    (zeros; none with ``bias=False``), torch's arguments including ``device``/``dtype``."""

    def __init__(self, normalized_shape: int | tuple[int, ...], eps: float = 1e-5,
                 elementwise_affine: bool = True, bias: bool = True, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        dtype = factory_dtype(dtype)
        if isinstance(normalized_shape, int):
            normalized_shape = (normalized_shape,)
        self.normalized_shape, self.eps = tuple(normalized_shape), eps
        if elementwise_affine:
            self.weight = init.ones_(empty_parameter(*self.normalized_shape, dtype=dtype))
            self.bias = empty_parameter(*self.normalized_shape, dtype=dtype) if bias else None
        else:
            self.weight = self.bias = None
        place(self, device)

    def forward(self, x: Tensor) -> Tensor:
        return layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}"


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


class Dropout2d(Dropout):
    """Channel dropout: zero whole channels of (N, C, H, W) with probability ``p`` in training
    (torch's ``nn.Dropout2d``); the identity in eval mode."""

    def forward(self, x: Tensor) -> Tensor:
        return dropout2d(x, self.p, self.training)


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
        return x.gelu(self.approximate)


class Tanh(Module):
    def forward(self, x: Tensor) -> Tensor:
        return x.tanh()


class Sigmoid(Module):
    def forward(self, x: Tensor) -> Tensor:
        return x.sigmoid()


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


class Embedding(Module):
    """A lookup table: ``weight[indices]``, weight (num_embeddings, embedding_dim) ~ N(0, 1).

    The gradient of a row used several times in a batch is the sum of its uses. With
    ``padding_idx`` that row starts at zeros and gets no gradient (torch's behaviour), so it
    stays what it is set to.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
                 max_norm: float | None = None, norm_type: float = 2.0,
                 scale_grad_by_freq: bool = False, sparse: bool = False, _weight: Any = None,
                 _freeze: bool = False, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        dtype = factory_dtype(dtype)
        if max_norm is not None or scale_grad_by_freq or sparse:
            raise ValueError(error("Embedding", "max_norm, scale_grad_by_freq and sparse are "
                                   "not supported; leave them at their defaults."))
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise ValueError(error("Embedding", f"padding_idx {padding_idx} is outside "
                                       f"[-{num_embeddings}, {num_embeddings})."))
            padding_idx %= num_embeddings
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.padding_idx = padding_idx
        self.weight = empty_parameter(num_embeddings, embedding_dim, dtype=dtype)
        if _weight is None:
            self.reset_parameters()
        else:  # torch's from_pretrained path: these values, as they are
            self.weight.copy_(_weight)
        self.weight.requires_grad = not _freeze
        place(self, device)

    def reset_parameters(self) -> None:
        """N(0, 1) draws, the padding row zeroed (torch's init)."""
        init.normal_(self.weight)
        if self.padding_idx is not None:
            self.weight.array[self.padding_idx] = 0

    def forward(self, indices: Any) -> Tensor:
        return embedding(indices, self.weight, self.padding_idx)

    def extra_repr(self) -> str:
        pad = "" if self.padding_idx is None else f", padding_idx={self.padding_idx}"
        return f"{self.num_embeddings}, {self.embedding_dim}{pad}"


class ModuleList(Module):
    """A list of modules, registered as children "0", "1", ... (no forward of its own)."""

    def __init__(self, modules: Iterable[Module] | None = None) -> None:
        super().__init__()
        for m in modules or ():
            self.append(m)

    def append(self, module: Module) -> ModuleList:
        if not isinstance(module, Module):
            raise TypeError(error("ModuleList", f"can only hold Modules, got "
                                  f"{type(module).__name__}."))
        setattr(self, str(len(self._modules)), module)
        return self

    def extend(self, modules: Iterable[Module]) -> ModuleList:
        for m in modules:
            self.append(m)
        return self

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def __getitem__(self, index: int | slice) -> Any:
        layers = list(self._modules.values())
        if isinstance(index, slice):
            return ModuleList(layers[index])
        if not -len(layers) <= index < len(layers):
            raise IndexError(error("ModuleList", f"index {index} is out of range for "
                                   f"{len(layers)} modules."))
        return layers[index]


class ModuleDict(Module):
    """A dict of modules, registered as children under their keys (insertion order)."""

    def __init__(self, modules: Mapping[str, Module] | None = None) -> None:
        super().__init__()
        for name, m in (modules or {}).items():
            self[name] = m

    def __setitem__(self, name: str, module: Module) -> None:
        if not isinstance(module, Module):
            raise TypeError(error("ModuleDict", f"value for {name!r} is a "
                                  f"{type(module).__name__}, not a Module."))
        setattr(self, name, module)

    def __getitem__(self, name: str) -> Module:
        return self._modules[name]

    def __contains__(self, name: object) -> bool:
        return name in self._modules

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[str]:
        return iter(self._modules)

    def keys(self) -> Any:
        return self._modules.keys()

    def values(self) -> Any:
        return self._modules.values()

    def items(self) -> Any:
        return self._modules.items()
