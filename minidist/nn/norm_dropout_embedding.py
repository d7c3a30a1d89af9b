"""torch's LayerNorm, Dropout2d and Embedding: the other plain layers a transformer or a CNN uses.

The main job's layers (Linear, ReLU, Dropout, Flatten, Identity, Sequential) are in
``minidist/nn/layers.py``; these follow the same conventions (torch's names, arguments, keys
and default init) and are also importable from there (``nn.layers.LayerNorm``), from ``nn``
and from torch's ``nn.modules.<file>`` paths.
"""

from __future__ import annotations

from typing import Any

from minidist.nn import init
from minidist.nn.layers import Dropout, empty_parameter, factory_dtype, place
from minidist.nn.module import Module
from minidist.tensor import Tensor, dropout2d, embedding, layer_norm
from minidist.tensor.core import error
from minidist.tensor.inplace_methods import copy_


class LayerNorm(Module):
    """Normalize over the trailing ``normalized_shape`` dims; keys ``weight`` (ones), ``bias``
    (zeros; none with ``bias=False``), torch's arguments including ``device``/``dtype``."""

    weight: Tensor | None
    bias: Tensor | None

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


class Dropout2d(Dropout):
    """Channel dropout: zero whole channels of (N, C, H, W) with probability ``p`` in training
    (torch's ``nn.Dropout2d``); the identity in eval mode."""

    def forward(self, x: Tensor) -> Tensor:
        return dropout2d(x, self.p, self.training)


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
            copy_(self.weight, _weight)
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
