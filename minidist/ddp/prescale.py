"""The fast path of ``hooks.prescaled_allreduce_hook``: the average folded into backward.

The default hook divides each bucket by n and all-reduces the sum (one pass over the
gradients to divide). This fast path removes that pass: every parameter's bucket slot is its
gradient destination (``minidist.tensor.GradDestination``) with ``scale = 1/n``, so backward
writes ``grad / n`` where it writes the gradient anyway, and the hook's SUM is the average::

    prepare(dests, buckets, n)     a synced step starts: empty slots get scale 1/n; a slot that
                                   already holds a gradient (no_sync accumulation,
                                   zero_grad(set_to_none=False)) keeps scale 1
    grad_ready(bucket, k, dest)    gradient k is complete: a slot written with scale 1 is
                                   divided now (once), and its scale goes back to 1 so that a
                                   later backward outside a synced step is not averaged
    reset(dests)                   no averaging outside a synced step

The Reducer calls these only while ``prescaled_allreduce_hook`` is registered;
``benchmarks/ddp_scaling.py --fold`` measures what it saves.
"""

from __future__ import annotations

from typing import Any, Sequence


class FoldedAverage:
    """The per-step scales of the gradient destinations under the prescaled hook."""

    def __init__(self) -> None:
        self.divisor = 1

    def prepare(self, dests: Sequence[Any], buckets: Sequence[Any], divisor: int) -> None:
        """A synced step starts: gradients written from now on are divided by ``divisor``."""
        self.divisor = divisor
        for b in buckets:
            folds = divisor > 1 and b.buffer.dtype.kind == "f"
            for p, i in zip(b.params, b.spec.param_indices):
                dests[i].scale = 1.0 / divisor if folds and p.grad is None else 1.0

    def grad_ready(self, view: Any, dest: Any, written_unscaled: bool) -> None:
        """Gradient complete in ``view``: divide it if it was not written divided."""
        if written_unscaled and self.divisor > 1 and view.dtype.kind == "f":
            view /= view.dtype.type(self.divisor)
        dest.scale = 1.0

    @staticmethod
    def reset(dests: Sequence[Any]) -> None:
        """Every destination back to scale 1 (outside a synced step nothing is averaged)."""
        for d in dests:
            d.scale = 1.0


__all__ = ["FoldedAverage"]
