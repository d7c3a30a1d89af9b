"""``MultiheadAttention`` with torch's parameters, state_dict keys, arguments and returns.

    mha = nn.MultiheadAttention(embed_dim=16, num_heads=4, batch_first=True)
    y, w = mha(x, x, x, attn_mask=causal)      # x (N, L, 16) -> y (N, L, 16), w (N, L, L)

One layer, h heads of size d = E / h, all from one packed projection::

    x (N, L, E) --in_proj (3E, E)--> q | k | v          each (N, L, E)
    q, k, v  --split heads-->  (N, h, L, d)
    w = softmax(q k^T / sqrt(d) + mask)                 (N, h, L, S)
    y = (dropout(w) @ v)  --merge heads-->  (N, L, E)  --out_proj (E, E)--> output

Keys as torch: ``in_proj_weight`` (3E, E), ``in_proj_bias`` (3E,), ``out_proj.weight``,
``out_proj.bias``, so a torch state_dict loads as is. Masks use torch's MultiheadAttention
convention: a bool ``attn_mask`` or ``key_padding_mask`` is True where attention is NOT allowed
(the opposite of ``F.scaled_dot_product_attention``'s bool mask); float masks are added.
"""

from __future__ import annotations

from typing import Any

import numpy

from minidist import xp as backend
from minidist.nn import init
from minidist.nn.layers import Linear, empty_parameter
from minidist.nn.module import Module
from minidist.tensor import Tensor, dropout, linear, split, swapaxes
from minidist.tensor.attention import attention_weights
from minidist.tensor.core import error


def _additive(mask: Any, dtype: Any, op: str) -> Any:
    """A float mask to add to the scores: bool True -> -inf, False -> 0; float kept."""
    m = mask.array if isinstance(mask, Tensor) else mask
    xp = backend.default_array_module() if isinstance(m, (list, tuple)) else \
        backend.get_array_module(m)
    m = xp.asarray(m)
    if m.dtype == numpy.bool_:
        return xp.where(m, xp.asarray(-numpy.inf, dtype=dtype), xp.asarray(0, dtype=dtype))
    if not numpy.issubdtype(m.dtype, numpy.floating):
        raise TypeError(error(op, f"masks must be bool or float, got dtype {m.dtype}."))
    return m.astype(dtype, copy=False)


class MultiheadAttention(Module):
    """torch's ``nn.MultiheadAttention(embed_dim, num_heads, dropout=0.0, bias=True, ...)``.

    >>> import minidist
    >>> from minidist import nn
    >>> mha = nn.MultiheadAttention(16, 4, batch_first=True)
    >>> x = minidist.randn(2, 5, 16)
    >>> causal = minidist.triu(minidist.ones(5, 5), diagonal=1).bool()   # True: masked out
    >>> out, weights = mha(x, x, x, attn_mask=causal)
    >>> out.shape, weights.shape
    ((2, 5, 16), (2, 5, 5))

    Args:
        embed_dim: E, the model width (query, key and value all have it here).
        num_heads: h; E must divide by it.
        dropout: dropout on the attention weights in training mode.
        bias: biases on the input and output projections.
        add_bias_kv, add_zero_attn: only False (torch's default) is supported.
        kdim, vdim: only None or ``embed_dim`` (packed projection).
        batch_first: inputs and output are (N, L, E) if True, (L, N, E) if False (torch's
            default).
        device, dtype: where and how to create the parameters (dtype float32 by default).
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim: int | None = None,
                 vdim: int | None = None, batch_first: bool = False, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        name = "MultiheadAttention"
        if embed_dim <= 0 or num_heads <= 0 or embed_dim % num_heads:
            raise ValueError(error(name, f"embed_dim ({embed_dim}) must be a positive multiple "
                                   f"of num_heads ({num_heads})."))
        if add_bias_kv or add_zero_attn or kdim not in (None, embed_dim) or \
                vdim not in (None, embed_dim):
            raise ValueError(error(name, "add_bias_kv, add_zero_attn and kdim/vdim other than "
                                   "embed_dim are not supported."))
        if not 0.0 <= dropout <= 1.0:
            raise ValueError(error(name, f"dropout must be in [0, 1], got {dropout}."))
        dtype = numpy.float32 if dtype is None else numpy.dtype(dtype)
        self.embed_dim, self.num_heads, self.dropout = embed_dim, num_heads, dropout
        self.head_dim, self.batch_first = embed_dim // num_heads, batch_first
        self.in_proj_weight = empty_parameter(3 * embed_dim, embed_dim, dtype=dtype)
        self.in_proj_bias = empty_parameter(3 * embed_dim, dtype=dtype) if bias else None
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias, dtype=dtype)
        init.xavier_uniform_(self.in_proj_weight)  # torch's _reset_parameters
        if bias:
            init.zeros_(self.out_proj.bias)
        if device is not None:
            self.to(device)

    def forward(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Any = None,
                need_weights: bool = True, attn_mask: Any = None,
                average_attn_weights: bool = True, is_causal: bool = False) -> tuple:
        """Attend from ``query`` to ``key``/``value``.

        Args:
            query: (N, L, E) if batch_first else (L, N, E); (L, E) unbatched.
            key, value: (N, S, E) / (S, N, E) / (S, E). Passing the same tensor three times
                (self-attention) runs one fused (3E, E) projection.
            key_padding_mask: (N, S): bool True (or -inf) marks keys to ignore.
            need_weights: also return the attention weights.
            attn_mask: (L, S) or (N * num_heads, L, S): bool True = not allowed, or float added.
            average_attn_weights: average the returned weights over heads.
            is_causal: a hint that ``attn_mask`` is causal; as in torch it needs ``attn_mask``.

        Returns:
            ``(attn_output, attn_weights)``: the output in the input's layout, and the weights
            (N, L, S) (or (N, h, L, S) unaveraged) after dropout, or None without
            ``need_weights``.
        """
        name = "MultiheadAttention"
        if is_causal and attn_mask is None:
            raise ValueError(error(name, "is_causal=True needs attn_mask as well (as torch): "
                                   "pass the causal mask, e.g. triu(ones(L, L), 1).bool()."))
        self_attention = query is key and key is value
        unbatched = query.ndim == 2
        if unbatched:
            query, key, value = (t.unsqueeze(1 if not self.batch_first else 0)
                                 for t in (query, key, value))
        if not self.batch_first:
            query, key, value = (swapaxes(t, 0, 1) for t in (query, key, value))
        if self_attention:
            key = value = query
        n, L, E = query.shape
        if E != self.embed_dim or key.shape[-1] != E or value.shape[-1] != E:
            raise ValueError(error(name, f"query, key and value must end with embed_dim="
                                   f"{self.embed_dim}, got {query.shape}, {key.shape}, "
                                   f"{value.shape} (batch_first={self.batch_first})."))
        S = key.shape[1]
        if self_attention:
            q, k, v = split(linear(query, self.in_proj_weight, self.in_proj_bias), E, -1)
        else:
            ws = split(self.in_proj_weight, E, 0)
            bs = split(self.in_proj_bias, E, 0) if self.in_proj_bias is not None else (None,) * 3
            q, k, v = (linear(t, w, b) for t, w, b in zip((query, key, value), ws, bs))
        h, d = self.num_heads, self.head_dim
        q, k, v = (swapaxes(t.reshape(n, t.shape[1], h, d), 1, 2) for t in (q, k, v))

        mask = None
        if attn_mask is not None:
            mask = _additive(attn_mask, q.dtype, name)
            if mask.ndim == 3:
                mask = mask.reshape(n, h, L, S)
            elif mask.shape != (L, S):
                raise ValueError(error(name, f"attn_mask must be ({L}, {S}) or "
                                       f"({n * h}, {L}, {S}), got {tuple(mask.shape)}."))
        if key_padding_mask is not None:
            pad = _additive(key_padding_mask, q.dtype, name)
            if tuple(pad.shape) != ((n, S) if not unbatched else (S,)):
                raise ValueError(error(name, f"key_padding_mask must be ({n}, {S}), got "
                                       f"{tuple(pad.shape)}."))
            pad = pad.reshape(n, 1, 1, S)
            mask = pad if mask is None else mask + pad
        weights = attention_weights(q, k, mask)                     # (N, h, L, S)
        weights = dropout(weights, self.dropout, self.training)
        out = swapaxes(weights @ v, 1, 2).reshape(n, L, E)          # merge heads
        out = self.out_proj(out)
        if not self.batch_first:
            out = swapaxes(out, 0, 1)
        if unbatched:
            out = out.squeeze(1 if not self.batch_first else 0)
        if not need_weights:
            return out, None
        if average_attn_weights:
            weights = weights.mean(axis=1)
        return out, (weights.squeeze(0) if unbatched else weights)

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
                f"dropout={self.dropout}, batch_first={self.batch_first}")
