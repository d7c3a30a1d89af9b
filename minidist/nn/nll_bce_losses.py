"""torch's likelihood losses as modules: ``NLLLoss`` (after ``LogSoftmax``), ``BCELoss`` (on
probabilities), ``BCEWithLogitsLoss`` (on logits, stable).

The main job's loss, ``CrossEntropyLoss``, and ``MSELoss`` are in ``minidist/nn/losses.py``;
these are also importable from there (``nn.losses.NLLLoss``) and from ``nn``.
"""

from __future__ import annotations

from typing import Any

from minidist.nn.module import Module
from minidist.tensor import Tensor, nll_loss
from minidist.tensor.core import error
from minidist.tensor.nn_ops import binary_cross_entropy, binary_cross_entropy_with_logits


class NLLLoss(Module):
    """``loss(log_probs (N, C), target (N,) int)``; use after ``LogSoftmax``."""

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        self.reduction = reduction

    def forward(self, input: Tensor, target: Any) -> Tensor:  # noqa: A002 - torch's name
        return nll_loss(input, target, self.reduction)


class BCELoss(Module):
    """torch's ``nn.BCELoss(weight=None, size_average=None, reduce=None, reduction="mean")``:
    binary cross-entropy of probabilities in [0, 1] (see ``nn.functional.binary_cross_entropy``).
    """

    def __init__(self, weight: Any = None, size_average: None = None, reduce: None = None,
                 reduction: str = "mean") -> None:
        super().__init__()
        if size_average is not None or reduce is not None:
            raise ValueError(error("BCELoss", "size_average and reduce are deprecated in torch "
                                   "and not supported; use reduction=."))
        self.weight, self.reduction = weight, reduction

    def forward(self, input: Tensor, target: Any) -> Tensor:  # noqa: A002 - torch's name
        return binary_cross_entropy(input, target, self.weight, reduction=self.reduction)


class BCEWithLogitsLoss(Module):
    """torch's ``nn.BCEWithLogitsLoss(weight=None, size_average=None, reduce=None,
    reduction="mean", pos_weight=None)``: sigmoid and binary cross-entropy in one stable step."""

    def __init__(self, weight: Any = None, size_average: None = None, reduce: None = None,
                 reduction: str = "mean", pos_weight: Any = None) -> None:
        super().__init__()
        if size_average is not None or reduce is not None:
            raise ValueError(error("BCEWithLogitsLoss", "size_average and reduce are deprecated "
                                   "in torch and not supported; use reduction=."))
        self.weight, self.reduction, self.pos_weight = weight, reduction, pos_weight

    def forward(self, input: Tensor, target: Any) -> Tensor:  # noqa: A002 - torch's name
        return binary_cross_entropy_with_logits(input, target, self.weight,
                                                reduction=self.reduction,
                                                pos_weight=self.pos_weight)
