"""Transformer layers with torch's arguments, sub-module names and state_dict keys:
``TransformerEncoderLayer``, ``TransformerEncoder``, ``TransformerDecoderLayer``,
``TransformerDecoder``, ``Transformer``.

    layer = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, batch_first=True)
    encoder = nn.TransformerEncoder(layer, num_layers=2)     # two deep copies of `layer`
    y = encoder(x, mask=nn.Transformer.generate_square_subsequent_mask(x.shape[1]))

An encoder layer is self-attention then a feed-forward block, each with a residual around it::

    norm_first=False (torch's default, "post-norm"):
        x = norm1(x + dropout1(self_attn(x, x, x)))
        x = norm2(x + dropout2(linear2(dropout(activation(linear1(x))))))
    norm_first=True ("pre-norm"):
        x = x + dropout1(self_attn(norm1(x)))
        x = x + dropout2(linear2(dropout(activation(linear1(norm2(x))))))

A decoder layer adds cross-attention (``multihead_attn``) to the encoder's output ``memory``
between the two, with ``norm2``/``dropout2``; its feed-forward block uses ``norm3``/``dropout3``.
Masks follow ``nn.MultiheadAttention``: bool True (or -inf) marks what may NOT be attended.
"""

from __future__ import annotations

import copy
from typing import Any, Callable

from minidist import xp as backend
from minidist.nn import init
from minidist.nn.attention import MultiheadAttention
from minidist.nn.layers import Dropout, LayerNorm, Linear, ModuleList
from minidist.nn.module import Module
from minidist.tensor import Tensor, gelu, relu
from minidist.tensor.core import error


def get_activation(activation: str | Callable[[Tensor], Tensor]) -> Callable[[Tensor], Tensor]:
    """torch's ``activation=``: ``"relu"``, ``"gelu"`` or a callable (a function or Module)."""
    if callable(activation):
        return activation
    if activation == "relu":
        return relu
    if activation == "gelu":
        return gelu
    raise ValueError(error("Transformer", f"activation should be 'relu', 'gelu' or a callable, "
                           f"not {activation!r}."))


def clones(module: Module, n: int) -> ModuleList:
    """``n`` independent deep copies of ``module`` (torch's ``_get_clones``)."""
    return ModuleList([copy.deepcopy(module) for _ in range(n)])


class TransformerEncoderLayer(Module):
    """torch's ``nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward=2048, dropout=0.1,
    activation=relu, layer_norm_eps=1e-5, batch_first=False, norm_first=False, bias=True,
    device=None, dtype=None)``.

    >>> import minidist
    >>> from minidist import nn
    >>> layer = nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, batch_first=True)
    >>> layer(minidist.randn(2, 5, 16)).shape
    (2, 5, 16)
    """

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048,
                 dropout: float = 0.1, activation: Any = "relu", layer_norm_eps: float = 1e-5,
                 batch_first: bool = False, norm_first: bool = False, bias: bool = True,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                            batch_first=batch_first, **kw)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, **kw)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, **kw)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw)
        self.dropout1, self.dropout2 = Dropout(dropout), Dropout(dropout)
        self.activation = get_activation(activation)
        self.batch_first = batch_first

    def forward(self, src: Tensor, src_mask: Any = None, src_key_padding_mask: Any = None,
                is_causal: bool = False) -> Tensor:
        """One layer over ``src`` ((N, S, E) with batch_first, else (S, N, E))."""
        x = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            return x + self._ff_block(self.norm2(x))
        x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
        return self.norm2(x + self._ff_block(x))

    def _sa_block(self, x: Tensor, mask: Any, key_padding_mask: Any, is_causal: bool) -> Tensor:
        out = self.self_attn(x, x, x, attn_mask=mask, key_padding_mask=key_padding_mask,
                             need_weights=False, is_causal=is_causal and mask is not None)[0]
        return self.dropout1(out)

    def _ff_block(self, x: Tensor) -> Tensor:
        return self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(x)))))


class TransformerDecoderLayer(Module):
    """torch's ``nn.TransformerDecoderLayer(d_model, nhead, dim_feedforward=2048, dropout=0.1,
    activation=relu, layer_norm_eps=1e-5, batch_first=False, norm_first=False, bias=True,
    device=None, dtype=None)``: self-attention, cross-attention to ``memory``, feed-forward."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048,
                 dropout: float = 0.1, activation: Any = "relu", layer_norm_eps: float = 1e-5,
                 batch_first: bool = False, norm_first: bool = False, bias: bool = True,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                            batch_first=batch_first, **kw)
        self.multihead_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                                 batch_first=batch_first, **kw)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, **kw)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, **kw)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw)
        self.norm3 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw)
        self.dropout1, self.dropout2 = Dropout(dropout), Dropout(dropout)
        self.dropout3 = Dropout(dropout)
        self.activation = get_activation(activation)
        self.batch_first = batch_first

    def forward(self, tgt: Tensor, memory: Tensor, tgt_mask: Any = None, memory_mask: Any = None,
                tgt_key_padding_mask: Any = None, memory_key_padding_mask: Any = None,
                tgt_is_causal: bool = False, memory_is_causal: bool = False) -> Tensor:
        """One layer over ``tgt``, attending to the encoder output ``memory``."""
        x = tgt
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), tgt_mask, tgt_key_padding_mask)
            x = x + self._mha_block(self.norm2(x), memory, memory_mask, memory_key_padding_mask)
            return x + self._ff_block(self.norm3(x))
        x = self.norm1(x + self._sa_block(x, tgt_mask, tgt_key_padding_mask))
        x = self.norm2(x + self._mha_block(x, memory, memory_mask, memory_key_padding_mask))
        return self.norm3(x + self._ff_block(x))

    def _sa_block(self, x: Tensor, mask: Any, key_padding_mask: Any) -> Tensor:
        out = self.self_attn(x, x, x, attn_mask=mask, key_padding_mask=key_padding_mask,
                             need_weights=False)[0]
        return self.dropout1(out)

    def _mha_block(self, x: Tensor, mem: Tensor, mask: Any, key_padding_mask: Any) -> Tensor:
        out = self.multihead_attn(x, mem, mem, attn_mask=mask, key_padding_mask=key_padding_mask,
                                  need_weights=False)[0]
        return self.dropout2(out)

    def _ff_block(self, x: Tensor) -> Tensor:
        return self.dropout3(self.linear2(self.dropout(self.activation(self.linear1(x)))))


class TransformerEncoder(Module):
    """torch's ``nn.TransformerEncoder(encoder_layer, num_layers, norm=None,
    enable_nested_tensor=True, mask_check=True)``: ``num_layers`` deep copies of the layer
    (keys ``layers.0...``), then ``norm`` if given."""

    def __init__(self, encoder_layer: Module, num_layers: int, norm: Module | None = None,
                 enable_nested_tensor: bool = True, mask_check: bool = True) -> None:
        super().__init__()
        self.layers = clones(encoder_layer, num_layers)
        self.num_layers, self.norm = num_layers, norm

    def forward(self, src: Tensor, mask: Any = None, src_key_padding_mask: Any = None,
                is_causal: bool | None = None) -> Tensor:
        x = src
        for layer in self.layers:
            x = layer(x, src_mask=mask, src_key_padding_mask=src_key_padding_mask,
                      is_causal=bool(is_causal))
        return self.norm(x) if self.norm is not None else x


class TransformerDecoder(Module):
    """torch's ``nn.TransformerDecoder(decoder_layer, num_layers, norm=None)``."""

    def __init__(self, decoder_layer: Module, num_layers: int, norm: Module | None = None
                 ) -> None:
        super().__init__()
        self.layers = clones(decoder_layer, num_layers)
        self.num_layers, self.norm = num_layers, norm

    def forward(self, tgt: Tensor, memory: Tensor, tgt_mask: Any = None, memory_mask: Any = None,
                tgt_key_padding_mask: Any = None, memory_key_padding_mask: Any = None,
                tgt_is_causal: bool | None = None, memory_is_causal: bool = False) -> Tensor:
        x = tgt
        for layer in self.layers:
            x = layer(x, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                      tgt_key_padding_mask=tgt_key_padding_mask,
                      memory_key_padding_mask=memory_key_padding_mask)
        return self.norm(x) if self.norm is not None else x


class Transformer(Module):
    """torch's ``nn.Transformer(d_model=512, nhead=8, num_encoder_layers=6,
    num_decoder_layers=6, dim_feedforward=2048, dropout=0.1, activation=relu,
    custom_encoder=None, custom_decoder=None, layer_norm_eps=1e-5, batch_first=False,
    norm_first=False, bias=True, device=None, dtype=None)``: an encoder and a decoder stack,
    each ending in a LayerNorm; every parameter of 2+ dims re-drawn Xavier-uniform, as torch.
    """

    def __init__(self, d_model: int = 512, nhead: int = 8, num_encoder_layers: int = 6,
                 num_decoder_layers: int = 6, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation: Any = "relu", custom_encoder: Module | None = None,
                 custom_decoder: Module | None = None, layer_norm_eps: float = 1e-5,
                 batch_first: bool = False, norm_first: bool = False, bias: bool = True,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        layer_args = (d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps,
                      batch_first, norm_first, bias)
        self.encoder = custom_encoder if custom_encoder is not None else TransformerEncoder(
            TransformerEncoderLayer(*layer_args, **kw), num_encoder_layers,
            LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw))
        self.decoder = custom_decoder if custom_decoder is not None else TransformerDecoder(
            TransformerDecoderLayer(*layer_args, **kw), num_decoder_layers,
            LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw))
        for p in self.parameters():
            if p.ndim > 1:
                init.xavier_uniform_(p)
        self.d_model, self.nhead, self.batch_first = d_model, nhead, batch_first

    def forward(self, src: Tensor, tgt: Tensor, src_mask: Any = None, tgt_mask: Any = None,
                memory_mask: Any = None, src_key_padding_mask: Any = None,
                tgt_key_padding_mask: Any = None, memory_key_padding_mask: Any = None,
                src_is_causal: bool | None = None, tgt_is_causal: bool | None = None,
                memory_is_causal: bool = False) -> Tensor:
        """Encode ``src``, then decode ``tgt`` against it; returns the decoder's output."""
        memory = self.encoder(src, mask=src_mask, src_key_padding_mask=src_key_padding_mask,
                              is_causal=src_is_causal)
        return self.decoder(tgt, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                            tgt_key_padding_mask=tgt_key_padding_mask,
                            memory_key_padding_mask=memory_key_padding_mask)

    @staticmethod
    def generate_square_subsequent_mask(sz: int, device: Any = None, dtype: Any = None
                                        ) -> Tensor:
        """The causal float mask of torch: 0 on and below the diagonal, -inf above it."""
        xp = backend.default_array_module()
        mask = xp.triu(xp.full((sz, sz), -xp.inf, dtype=dtype or "float32"), 1)
        t = Tensor(mask)
        return t.to(device) if device is not None else t
