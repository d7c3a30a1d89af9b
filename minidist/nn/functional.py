"""Stateless versions of the layers (torch's ``nn.functional``), re-exported from the tensor layer.

    import minidist.nn.functional as F
    loss = F.cross_entropy(F.relu(F.linear(x, w, b)), y)
"""

from __future__ import annotations

from minidist.tensor import (adaptive_avg_pool2d, avg_pool2d, conv2d, cross_entropy, dropout,
                             dropout2d, embedding, gelu, layer_norm, linear, log_softmax,
                             max_pool2d, mse_loss, nll_loss, relu, scaled_dot_product_attention,
                             sigmoid, softmax, tanh)

__all__ = ["adaptive_avg_pool2d", "avg_pool2d", "conv2d", "cross_entropy", "dropout", "dropout2d",
           "embedding", "gelu", "layer_norm", "linear", "log_softmax", "max_pool2d", "mse_loss",
           "nll_loss", "relu", "scaled_dot_product_attention", "sigmoid", "softmax", "tanh"]
