"""The Reducer's two explicit states: where a synced step is (StepState), and where this
step's gradients go (SyncMode). Both are decided at named points, never inferred from flags."""

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


class SyncMode(enum.Enum):
    """Where this step's gradients go, decided once per step (``prepare_for_forward``)::

        no_sync()                        -> NO_SYNC    accumulate in the buckets, reduce nothing
        hook declares prescale, n > 1    -> PRESCALED  backward writes grad / n into the slots;
                                                       the hook's SUM is the average
        hook declares prescale, n == 1   -> LOCAL      nothing to average; each gradient is
                                                       checked for NaN/inf as it is written
        any other hook (fp16, PowerSGD)  -> RAW        the hook gets the gradients as written

    In every synced mode each ready bucket goes to ``comm_hook`` (default:
    ``hooks.allreduce_hook``), which leaves the average in the bucket.
    """

    NO_SYNC = "no_sync"
    PRESCALED = "prescaled"
    LOCAL = "local"
    RAW = "raw"


__all__ = ["StepState", "SyncMode"]
