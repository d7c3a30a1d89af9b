"""Loss modules: ``CrossEntropyLoss`` (fused, stable log-softmax + NLL), ``NLLLoss``,
``MSELoss``."""

from __future__ import annotations

from typing import Any

from minidist.nn.module import Module
from minidist.tensor import Tensor, cross_entropy, mse_loss, nll_loss


class CrossEntropyLoss(Module):
    """``loss(logits (N, C), target (N,) int)``; reduction "mean" (default), "sum" or "none"."""

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        self.reduction = reduction

    def forward(self, logits: Tensor, target: Any) -> Tensor:
        return cross_entropy(logits, target, self.reduction)


class MSELoss(Module):
    """``loss(input, target)`` = mean (or sum, or none) of squared differences."""

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        self.reduction = reduction

    def forward(self, input: Tensor, target: Any) -> Tensor:  # noqa: A002 - torch's name
        return mse_loss(input, target, self.reduction)


class NLLLoss(Module):
    """``loss(log_probs (N, C), target (N,) int)``; use after ``LogSoftmax``."""

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        self.reduction = reduction

    def forward(self, input: Tensor, target: Any) -> Tensor:  # noqa: A002 - torch's name
        return nll_loss(input, target, self.reduction)
