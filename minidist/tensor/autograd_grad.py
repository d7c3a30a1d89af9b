"""torch.autograd.grad: the backward walk with the gradients returned (not in the spine).

Activation checkpointing (``minidist.utils.checkpoint``, tensor/checkpoint.py) differentiates
a recomputed segment with it and hands the results to the outer backward. It reuses the
walk of autograd.py with another ``deliver``: nothing is accumulated into ``.grad``.
"""

from __future__ import annotations

from typing import Any, Sequence

from minidist.tensor.autograd import seed_gradient, walk_tape
from minidist.tensor.core import Tensor
from minidist.tensor.grad_destination import capturing


def grad(outputs: Tensor, inputs: Sequence[Tensor], grad_outputs: Any = None,
         retain_graph: bool = False) -> tuple[Any, ...]:
    """torch.autograd.grad: the gradients of ``outputs`` w.r.t. ``inputs``, RETURNED.

    Nothing is accumulated into any ``.grad`` and no post-accumulate-grad hook fires: leaves
    that are not in ``inputs`` are simply skipped. Activation checkpointing
    (``minidist.utils.checkpoint``) uses it to differentiate a recomputed segment and hand
    the results to the outer backward, which then accumulates them and fires the hooks once.

    Args:
        outputs: the tensor to differentiate (a scalar, or pass ``grad_outputs``).
        inputs: leaf tensors; a leaf the graph does not reach gets None.
        grad_outputs: d(something)/d(outputs), same shape as outputs (default 1 for a scalar).
        retain_graph: keep the tape so backward can run through it again.

    Returns:
        One gradient (an xp array, or None) per input, in order.
    """
    captured: dict[int, Any] = {id(t): None for t in inputs}

    def capture(leaf: Tensor, g: Any) -> None:  # summed in arrival order, as .grad is
        key = id(leaf)
        if key in captured:
            captured[key] = g if captured[key] is None else captured[key] + g

    seed = seed_gradient(outputs, grad_outputs)
    capturing.depth += 1  # no op may claim a destination or adopt into .grad meanwhile
    try:
        walk_tape(outputs, seed, retain_graph, capture, lambda leaf: None)
    finally:
        capturing.depth -= 1
    return tuple(captured[id(t)] for t in inputs)


__all__ = ["grad"]
