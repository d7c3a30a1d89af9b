"""What watches a DDP step without being it: the Reducer's observers and their four events.

The Reducer's core is bucket -> reduce -> average -> done. Everything that only watches or
protects that (the NaN/inf check, a GradScaler's unscale, the step timeline, timing stats) is
an observer, registered by the feature that needs it, and called at four events::

    step_start(reducer)       main thread: DDP's forward starts a step (synced, or not under
                              no_sync: ``reducer.require_sync``)
    bucket_ready(bucket)      main thread: the bucket is complete and launched (index order)
    bucket_reduced(bucket)    after the comm hook averaged it (on the comm thread with overlap)
    step_end(reducer)         main thread: every bucket reduced, before backward returns

An observer overrides only the events it needs; the Reducer calls only those (an event no
observer wants costs one empty loop). Registered here:

    NonfiniteCheck (watch wing)  nonfinite_grads="warn"|"raise" (default "warn")
    AmpUnscale                   a GradScaler scaled this step's loss (amp.add_scale_listener)
    timeline.StepTrace           MINIDIST_TRACE: the step timeline (minidist/tracing.py)
    StepStats                    DistributedDataParallel.last_step_stats, once read
    hooks.FoldedAverage          brought by the comm hook hooks.prescaled_allreduce_hook (a
                                 hook's ``observer`` attribute: registered while it is the hook)

    reducer.add_observer(obs)            # for every step from now on
    reducer.add_observer(obs, step=True) # this step only (dropped by the next forward)
"""

from __future__ import annotations

import time
from typing import Any


class ReducerObserver:
    """Base class: override the events you need (the others are never called)."""

    def step_start(self, reducer: Any) -> None:
        """DDP's forward starts a step (main thread); ``reducer.require_sync`` says if synced."""

    def bucket_ready(self, bucket: Any) -> None:
        """The bucket is complete and launched (main thread, in bucket order)."""

    def bucket_reduced(self, bucket: Any) -> None:
        """The comm hook has left the average in ``bucket.buffer``."""

    def step_end(self, reducer: Any) -> None:
        """Every bucket of a synced backward is reduced (main thread, before it returns)."""


EVENTS = ("step_start", "bucket_ready", "bucket_reduced", "step_end")


def overridden(observer: ReducerObserver, event: str) -> bool:
    """Whether ``observer`` implements ``event`` (the Reducer calls only those)."""
    return getattr(type(observer), event) is not getattr(ReducerObserver, event)


class AmpUnscale(ReducerObserver):
    """A GradScaler's unscale-on-reduce: each bucket is unscaled right after its reduction.

    The scaler's fused kernel unscales the bucket and flags inf/NaN in one pass, in place of
    the NaN/inf check (``bucket.finite = True``: the scaler reports, and skips the step); the
    flags are identical on every rank because the reduced buckets are. Registered for one
    step when ``scaler.scale(loss)`` runs on the thread that built the DDP model.
    """

    def __init__(self, scaler: Any) -> None:
        self.scaler = scaler

    def bucket_reduced(self, bucket: Any) -> None:
        if self.scaler.unscale_bucket_(bucket.buffer, bucket.params, bucket.names):
            bucket.finite = True


class StepStats(ReducerObserver):
    """Seconds of the last synced backward: ``wait_s`` (from the last bucket's launch until
    every bucket was reduced: the exposed communication) and ``comm_s`` (busy reducing).

    Reductions run one at a time in bucket order, so bucket k's starts when it was launched
    and the one before it ended (with overlap), or when the last bucket was launched and the
    one before it ended (without: they all run at the end of backward).
    """

    def __init__(self, overlap: bool) -> None:
        self.overlap = overlap
        self.stats = {"wait_s": 0.0, "comm_s": 0.0}
        self._launched: dict[int, float] = {}  # bucket index -> launch time, this step
        self._last_launch = 0.0
        self._free = 0.0  # when the previous reduction ended
        self._busy = 0.0

    def bucket_ready(self, bucket: Any) -> None:
        self._last_launch = self._launched[bucket.index] = time.perf_counter()
        if bucket.index == 0:
            self._free, self._busy = 0.0, 0.0

    def reduction_span(self, bucket: Any) -> tuple[float, float]:
        """(start, end) of ``bucket``'s reduction, which has just ended."""
        end = time.perf_counter()
        start = self._launched.get(bucket.index, end) if self.overlap else self._last_launch
        start = max(start, self._free)
        self._free = end
        return start, end

    def bucket_reduced(self, bucket: Any) -> None:
        start, end = self.reduction_span(bucket)
        self._busy += end - start

    def step_end(self, reducer: Any) -> None:
        self.stats = {"wait_s": time.perf_counter() - self._last_launch, "comm_s": self._busy}


class DDPExtension:
    """What a wing does to every DistributedDataParallel when it is built (``DDP_EXTENSIONS``):
    each method a no-op here. The watch wing's checks that every rank built the same run
    (minidist/watch/preflight.py)."""

    def planned(self, ddp: Any, metas: list, specs: list, group: Any) -> None:
        """The buckets are planned; nothing is allocated or sent yet. Collective: every rank
        runs the same extensions in the same order."""

    def built(self, ddp: Any) -> None:
        """The buckets are built and each one's all-reduce algorithm is known."""


DDP_EXTENSIONS: list[DDPExtension] = []  # a wing appends its own when it loads


__all__ = ["AmpUnscale", "DDPExtension", "DDP_EXTENSIONS", "EVENTS", "ReducerObserver",
           "StepStats", "overridden"]
