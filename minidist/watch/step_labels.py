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
``DistributedDataParallel.join()`` (ranks hand out different numbers of batches there), a
bucket keeps its plain label; label your own collectives where that matters
(docs/troubleshooting.md). After each synced step the plain labels return, so the steps a
joined rank shadows match.
"""

from __future__ import annotations

from typing import Any

from minidist.data.resume import batch_position
from minidist.ddp.observers import DDPExtension, ReducerObserver


class StepLabels(ReducerObserver):
    """Labels every bucket's all-reduce with this step's batch (``step_start``), and puts the
    plain labels back when the step ends (``step_end``)."""

    def __init__(self, ddp: Any) -> None:
        self.ddp = ddp
        self.plain = [b.label for b in ddp.buckets]

    def step_start(self, reducer: Any) -> None:
        position = batch_position()
        if position is None or self.ddp.joining:
            self.step_end(reducer)
            return
        epoch, batch = position
        for b, plain in zip(reducer.buckets, self.plain):
            b.label = f"{plain}, epoch {epoch} batch {batch}"

    def step_end(self, reducer: Any) -> None:
        for b, plain in zip(reducer.buckets, self.plain):
            b.label = plain


class LabelSteps(DDPExtension):
    """Every DistributedDataParallel with more than one rank gets a ``StepLabels``."""

    def built(self, ddp: Any) -> None:
        if ddp.world_size > 1:
            ddp.reducer.add_observer(StepLabels(ddp))


__all__ = ["LabelSteps", "StepLabels"]
