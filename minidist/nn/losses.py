"""Loss modules: ``CrossEntropyLoss`` (fused, stable log-softmax + NLL) and ``MSELoss``.

torch's other losses (``NLLLoss``, ``BCELoss``, ``BCEWithLogitsLoss``) are in
``nll_bce_losses.py`` beside this file, and importable from here too."""

from __future__ import annotations

from typing import Any

from minidist.nn.module import Module
from minidist.nn.nll_bce_losses import BCELoss, BCEWithLogitsLoss, NLLLoss  # noqa: F401
from minidist.tensor import Tensor, cross_entropy, mse_loss
from minidist.tensor.core import error


class CrossEntropyLoss(Module):
    """``loss(logits (N, C), target)``, target class indices (N,) or probabilities (N, C).

    torch's arguments in torch's order: ``weight`` (per class), ``ignore_index``,
    ``reduction`` ("mean" default, "sum", "none"), ``label_smoothing``; see
    ``minidist.tensor.cross_entropy`` for the formulas.
    """

    def __init__(self, weight: Any = None, size_average: None = None, ignore_index: int = -100,
                 reduce: None = None, reduction: str = "mean",
                 label_smoothing: float = 0.0) -> None:
        super().__init__()
        if isinstance(weight, str):
            raise TypeError(error("CrossEntropyLoss", f"the first argument is weight (torch's "
                                  f"order), got {weight!r}. Pass reduction={weight!r} by "
                                  "keyword."))
        if size_average is not None or reduce is not None:
            raise ValueError(error("CrossEntropyLoss", "size_average and reduce are deprecated "
                                   "in torch and not supported; use reduction=."))
        self.weight, self.ignore_index, self.reduction = weight, ignore_index, reduction
        self.label_smoothing = label_smoothing

    def forward(self, logits: Tensor, target: Any) -> Tensor:
        return cross_entropy(logits, target, self.weight, ignore_index=self.ignore_index,
                             reduction=self.reduction, label_smoothing=self.label_smoothing)


class MSELoss(Module):
    """``loss(input, target)`` = mean (or sum, or none) of squared differences."""

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        self.reduction = reduction

    def forward(self, input: Tensor, target: Any) -> Tensor:  # noqa: A002 - torch's name
        return mse_loss(input, target, self.reduction)
