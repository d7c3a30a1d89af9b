"""The prescaled comm hook: the plain average with the division by n folded into backward.

    ddp = DistributedDataParallel(model, comm_hook=prescaled_allreduce_hook)

An opt-in fast path beside the hooks of hooks.py (which exports these names too): the hook
only sums, and ``FoldedAverage``, the Reducer observer it brings (observers.py), makes
backward write each gradient already divided by n. Timed against the default by
``benchmarks/ddp_scaling.py --hooks 300`` (docs/how_ddp_works.md).
"""

from __future__ import annotations

from typing import Any

from minidist.ddp.bucket import Bucket
from minidist.ddp.observers import ReducerObserver
from minidist.tensor.scaled_grad import ScaledGradDestination


def prescaled_allreduce_hook(state: Any, bucket: Bucket) -> None:
    """An opt-in fast path: the average, with the division by n folded into backward.

    A named fast path beside ``allreduce_hook``. It brings its Reducer observer
    (``FoldedAverage`` below), which reserves each gradient's bucket slot with
    ``scale = 1/n`` (``minidist.tensor.GradDestination``) for a synced step: backward writes
    ``grad / n`` where it writes the gradient anyway (linear's weight gradient: the GEMM's
    64-row operand is scaled), so the all-reduce SUM is the average and no pass over the
    bucket divides it. Compare it with the default: ``benchmarks/ddp_scaling.py --hooks 300``.
    """
    if bucket.world_size > 1:
        bucket.all_reduce(bucket.buffer, "sum")


class FoldedAverage(ReducerObserver):
    """The Reducer's side of ``prescaled_allreduce_hook``: the per-step scales of the
    gradient destinations. The hook brings it (its ``observer`` attribute): the Reducer
    registers it while the hook is the comm hook, like any observer::

        step_start(reducer)     a synced step: empty slots get scale 1/n; a slot that already
                                holds a gradient (no_sync accumulation,
                                zero_grad(set_to_none=False)) keeps scale 1. Any other step
                                (no_sync): every slot scale 1, nothing is averaged
        bucket_ready(bucket)    its gradients are complete: a slot written with scale 1 is
                                divided now (once), and every scale goes back to 1, so that a
                                later backward outside a synced step is not averaged

    (A backward that raised keeps its scales until the next forward through DDP.)
    """

    def __init__(self) -> None:
        self.divisor = 1

    def step_start(self, reducer: Any) -> None:
        self.divisor = reducer.divisor if reducer.require_sync else 1
        for b in reducer.buckets:
            folds = self.divisor > 1 and b.buffer.dtype.kind == "f"
            for i, p in zip(b.spec.param_indices, b.params):
                dest = p.grad_destination
                if not isinstance(dest, ScaledGradDestination):  # the Reducer's plain slot
                    dest = p.grad_destination = ScaledGradDestination.of(dest)
                    reducer.grad_dests[i] = dest
                dest.scale = 1.0 / self.divisor if folds and p.grad is None else 1.0

    def bucket_ready(self, bucket: Any) -> None:
        for p, view in zip(bucket.params, bucket.views):
            dest = p.grad_destination
            if dest.scale == 1.0 and self.divisor > 1 and view.dtype.kind == "f":
                view /= view.dtype.type(self.divisor)  # written whole: divide it now
            dest.scale = 1.0


prescaled_allreduce_hook.observer = FoldedAverage  # type: ignore[attr-defined]


__all__ = ["FoldedAverage", "prescaled_allreduce_hook"]
