"""The Reducer's explicit step state (StepState): where a synced step is, decided at named
points, never inferred from flags."""

from __future__ import annotations

import enum


class StepState(enum.Enum):
    """Where the Reducer is in a synced step (one explicit state, as BucketState for a bucket)::

        IDLE --prepare_for_forward (sync)--> PREPARED --first gradient hook--> BACKWARD
          ^   (queues the end-of-backward check)                                  |
          '--- last bucket reduced (_finalize), or the check/an error ends it ----'

    Under ``no_sync`` (and after forward under ``no_grad``) the Reducer stays IDLE: hooks do
    nothing. The end-of-backward check raises if it finds the step not IDLE (a gradient never
    came, so a bucket was never reduced).
    """

    IDLE = "idle"              # no synced step in progress
    PREPARED = "prepared"      # forward prepared a synced step; no gradient has arrived yet
    BACKWARD = "backward"      # gradients are arriving; the end-of-backward check is queued


__all__ = ["StepState"]
