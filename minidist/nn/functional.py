"""Stateless versions of the layers (torch's ``nn.functional``), re-exported from the tensor layer.

    import minidist.nn.functional as F
    loss = F.cross_entropy(F.relu(F.linear(x, w, b)), y)

torch's ``inplace=`` arguments (``relu``, ``dropout``, ``dropout2d``) are accepted; the result
is computed out of place (the tape keeps the input), with the same values.
"""

from __future__ import annotations

from minidist import tensor as ops
from minidist.tensor import (Tensor, adaptive_avg_pool2d, avg_pool2d, conv2d, cross_entropy,
                             embedding, gelu, layer_norm, linear, log_softmax, max_pool2d,
                             mse_loss, nll_loss, scaled_dot_product_attention, sigmoid, softmax,
                             tanh)
from minidist.tensor.conv_transpose import conv_transpose2d
from minidist.tensor.nn_ops import (binary_cross_entropy, binary_cross_entropy_with_logits,
                                    leaky_relu, normalize, one_hot)


def relu(input: Tensor, inplace: bool = False) -> Tensor:  # noqa: A002 - torch's name
    """``max(input, 0)`` (torch's ``F.relu``)."""
    return ops.relu(input)


def dropout(input: Tensor, p: float = 0.5, training: bool = True,  # noqa: A002
            inplace: bool = False) -> Tensor:
    """Inverted dropout (torch's ``F.dropout``; the identity when not ``training``)."""
    return ops.dropout(input, p, training)


def dropout2d(input: Tensor, p: float = 0.5, training: bool = True,  # noqa: A002
              inplace: bool = False) -> Tensor:
    """Channel dropout of (N, C, H, W) (torch's ``F.dropout2d``)."""
    return ops.dropout2d(input, p, training)


__all__ = ["adaptive_avg_pool2d", "avg_pool2d", "conv2d", "cross_entropy", "dropout", "dropout2d",
           "embedding", "gelu", "layer_norm", "linear", "log_softmax", "max_pool2d", "mse_loss",
           "nll_loss", "relu", "scaled_dot_product_attention", "sigmoid", "softmax", "tanh",
           "conv_transpose2d", "binary_cross_entropy", "binary_cross_entropy_with_logits",
           "leaky_relu", "normalize", "one_hot"]
