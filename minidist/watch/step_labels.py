"""A skipped training step, caught at the next bucket: DDP's all-reduces carry the batch.

Every collective's fingerprint (comm/calls.py) holds its label, and ranks whose fingerprints
differ fail at that call, on every algorithm, before a result is returned. DDP's buckets are
labelled ``bucket=3``, the same every step, so a rank that skips a step (``continue`` after a
bad loss) pairs its next step with the others' current one, and every average after it is
wrong. This observer adds where the rank stands in its ``DataLoader`` (a loader fed by a
``DistributedSampler``; ``minidist.data.resume.batch_position``)::

    step     rank 0                         rank 1 (skips batch 50)
    49       bucket=0, epoch 0 batch 49     bucket=0, epoch 0 batch 49    same: reduced
    50       bucket=0, epoch 0 batch 50     (forward, then continue)
    50/51    bucket=0, epoch 0 batch 50  x  bucket=0, epoch 0 batch 51    CollectiveMismatch

The ranks of a job hand out their shards' batches in step, so the labels differ only where
the steps do. Without a sharded loader (batches built by hand), and inside
``DistributedDataParallel.join()`` (ranks hand out different numbers of batches there; the
steps a rank shadows have no batch), a bucket keeps its plain label, its ``name``; label your
own collectives where that matters (docs/troubleshooting.md).
"""

from __future__ import annotations

from typing import Any

from minidist.data.resume import batch_position
from minidist.ddp.observers import DDPExtension, ReducerObserver


class StepLabels(ReducerObserver):
    """Labels every bucket's all-reduce with this step's batch, when DDP's forward starts the
    step (``step_start``: before backward, so the reduction itself runs no line of it)."""

    def __init__(self, ddp: Any) -> None:
        self.ddp = ddp

    def step_start(self, reducer: Any) -> None:
        position = None if self.ddp.joining else batch_position()
        for b in reducer.buckets:
            b.label = b.name if position is None else \
                f"{b.name}, epoch {position[0]} batch {position[1]}"


class LabelSteps(DDPExtension):
    """Every DistributedDataParallel with more than one rank gets a ``StepLabels``."""

    def built(self, ddp: Any) -> None:
        if ddp.world_size > 1:
            ddp.reducer.add_observer(StepLabels(ddp))


__all__ = ["LabelSteps", "StepLabels"]
