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
    grad_checks.AmpUnscale       a GradScaler scaled this step's loss (amp.add_scale_listener)
    timeline.StepTrace           MINIDIST_TRACE: the step timeline (minidist/tracing.py)
    timeline.StepStats           DistributedDataParallel.last_step_stats, once read
    prescaled.FoldedAverage      brought by the comm hook prescaled_allreduce_hook (a hook's
                                 ``observer`` attribute: registered while it is the hook)

    reducer.add_observer(obs)            # for every step from now on
    reducer.add_observer(obs, step=True) # this step only (dropped by the next forward)
"""

from __future__ import annotations

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


class DDPExtension:
    """What a wing does to every DistributedDataParallel when it is built (``DDP_EXTENSIONS``):
    each method a no-op here. The watch wing's checks that every rank built the same run
    (minidist/watch/preflight.py)."""

    def planned(self, ddp: Any, metas: list, specs: list, group: Any) -> None:
        """The buckets are planned; nothing is allocated or sent yet. Collective: every rank
        runs the same extensions in the same order."""

    def built(self, ddp: Any) -> None:
        """The buckets and the reducer are built and each bucket's all-reduce algorithm is
        known (``ddp.reducer.add_observer`` attaches to every step)."""


DDP_EXTENSIONS: list[DDPExtension] = []  # a wing appends its own when it loads


def __getattr__(name: str) -> Any:  # observers.AmpUnscale, .StepStats: where they moved
    from minidist.ddp import grad_checks, timeline
    return getattr(timeline if name == "StepStats" else grad_checks, name)


__all__ = ["DDPExtension", "DDP_EXTENSIONS", "EVENTS", "ReducerObserver",
           "overridden"]
