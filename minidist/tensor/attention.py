"""Scaled dot-product attention (torch's ``F.scaled_dot_product_attention``), from tape ops.

For queries ``q (..., L, E)``, keys ``k (..., S, E)`` and values ``v (..., S, Ev)``::

    scores  = q @ k^T * scale                       (..., L, S)    scale = 1/sqrt(E)
    scores += mask                                  -inf where a query may not look
    weights = softmax(scores, dim=-1)               each row sums to 1
    out     = dropout(weights, p) @ v               (..., L, Ev)

    is_causal=True: query i sees keys 0..i          L=S=4:   1 0 0 0
    (the lower triangle, aligned top-left, as torch)         1 1 0 0
                                                             1 1 1 0
                                                             1 1 1 1

Masks follow torch's SDPA: a bool ``attn_mask`` is True where attention is ALLOWED; a float
one is added to the scores. (``nn.MultiheadAttention`` takes the opposite bool convention,
True = masked out, as torch's does.) Every step is a recorded op (matmul, masked_fill, softmax,
dropout), so the gradients come from theirs; a row with every key masked gives NaN, as torch.
"""

from __future__ import annotations

import math
from typing import Any

import numpy

from minidist import xp as backend
from minidist.tensor.core import Tensor, error
from minidist.tensor.elementwise import masked_fill
from minidist.tensor.functional import dropout, softmax
from minidist.tensor.linalg import matmul
from minidist.tensor.shape import swapaxes


def attention_weights(query: Tensor, key: Tensor, attn_mask: Any = None, is_causal: bool = False,
                      scale: float | None = None) -> Tensor:
    """``softmax(q @ k^T * scale + mask)``: the attention weights, shape (..., L, S).

    Args:
        query: (..., L, E).
        key: (..., S, E).
        attn_mask: None, a bool mask (True = may attend) or a float mask added to the scores,
            broadcastable to (..., L, S).
        is_causal: mask out keys after each query (cannot be combined with ``attn_mask``).
        scale: the factor on ``q @ k^T``; default ``1 / sqrt(E)``.
    """
    if query.ndim < 2 or key.ndim < 2 or query.shape[-1] != key.shape[-1]:
        raise ValueError(error("scaled_dot_product_attention", f"query {query.shape} and key "
                               f"{key.shape} must be (..., L, E) and (..., S, E) with the same "
                               "E."))
    if is_causal and attn_mask is not None:
        raise ValueError(error("scaled_dot_product_attention", "got both attn_mask and "
                               "is_causal=True. Pass one (fold the causal mask into attn_mask)."))
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    scores = matmul(query, swapaxes(key, -2, -1)) * scale
    L, S = query.shape[-2], key.shape[-2]
    xp = backend.get_array_module(scores.array)
    if is_causal:
        attn_mask = xp.tril(xp.ones((L, S), dtype=bool))
    if attn_mask is not None:
        mask = attn_mask.array if isinstance(attn_mask, Tensor) else xp.asarray(attn_mask)
        if mask.dtype == numpy.bool_:
            scores = masked_fill(scores, ~mask, float("-inf"))
        else:
            scores = scores + (attn_mask if isinstance(attn_mask, Tensor)
                               else Tensor(mask.astype(scores.dtype, copy=False)))
    return softmax(scores, -1)


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Any = None,
                                 dropout_p: float = 0.0, is_causal: bool = False,
                                 scale: float | None = None) -> Tensor:
    """torch's ``F.scaled_dot_product_attention``: ``dropout(softmax(q k^T * scale + mask)) @ v``.

    >>> import minidist
    >>> from minidist.nn import functional as F
    >>> q = k = v = minidist.randn(2, 4, 8, 16)      # (batch, heads, tokens, head dim)
    >>> F.scaled_dot_product_attention(q, k, v, is_causal=True).shape
    (2, 4, 8, 16)

    Args:
        query: (..., L, E); key: (..., S, E); value: (..., S, Ev).
        attn_mask: None, bool (True = may attend) or float (added), broadcastable to (..., L, S).
        dropout_p: dropout on the weights (applied whenever > 0, as torch: pass 0.0 in eval).
        is_causal: the lower-triangular mask (query i sees keys 0..i).
        scale: default ``1 / sqrt(E)``.

    Returns:
        (..., L, Ev).
    """
    weights = attention_weights(query, key, attn_mask, is_causal, scale)
    return matmul(dropout(weights, dropout_p, training=True), value)
