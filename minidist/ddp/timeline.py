"""What DistributedDataParallel records on the step timeline (minidist/tracing.py, MINIDIST_TRACE),
and the timing of its last step (``last_step_stats``: StepStats, which the timeline extends).

A Reducer observer (observers.py), registered by ``follow_tracer`` (DDP's forward asks it every
step) while a Tracer is active::

    compute lane        bucket k ready, bucket k launch (instants)   wait for all-reduce (span)
    communication lane  all_reduce bucket k (span: bytes, algorithm, busbw), bucket k done
    counter             exposed comm [ms]
"""

from __future__ import annotations

import time
from typing import Any, Sequence

from minidist import tracing as trace
from minidist.ddp.observers import ReducerObserver


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


class StepTrace(StepStats):
    """The step timeline of one DDP model: each bucket's reduction and the exposed wait.

    Args:
        tracer: the active Tracer.
        algorithms: the algorithm each bucket's all-reduce runs (planned at construction).
        overlap: whether reductions run on the comm thread during backward.
    """

    def __init__(self, tracer: trace.Tracer, algorithms: Sequence[str], overlap: bool) -> None:
        super().__init__(overlap)
        self.tracer = tracer
        self.algorithms = list(algorithms)
        self.step = 0

    def bucket_ready(self, bucket: Any) -> None:
        super().bucket_ready(bucket)
        for what in ("ready", "launch"):
            self.tracer.instant(f"bucket {bucket.index} {what}", args={"step": self.step})

    def bucket_reduced(self, bucket: Any) -> None:
        """One all-reduce on the communication lane: bytes, algorithm, bus bandwidth.

        busbw = 2(n-1)/n x bytes / time: what each rank's link carried per second by the
        bandwidth-optimal (ring) schedule, comparable across world sizes (nccl-tests' busbw).
        """
        t0, t1 = self.reduction_span(bucket)
        self._busy += t1 - t0
        n, nbytes = bucket.world_size, int(bucket.buffer.nbytes)
        if n > 1:  # one rank: nothing was all-reduced
            busbw = 2 * (n - 1) / n * nbytes / max(t1 - t0, 1e-9) / 1e9
            args = {"step": self.step, "bytes": nbytes, "op": "sum", "bucket": bucket.index,
                    "algorithm": self.algorithms[bucket.index], "busbw_GBps": round(busbw, 3)}
            self.tracer.complete(f"all_reduce bucket {bucket.index}", t0, t1, lane=trace.COMM,
                                 cat="allreduce", args=args)
        self.tracer.instant(f"bucket {bucket.index} done", lane=trace.COMM,
                            args={"step": self.step})

    def step_end(self, reducer: Any) -> None:
        super().step_end(reducer)
        t0 = self._last_launch
        self.tracer.complete("wait for all-reduce", t0, t0 + self.stats["wait_s"],
                             cat="exposed", args={"step": self.step})
        self.tracer.counter("exposed comm [ms]", {"ms": self.stats["wait_s"] * 1e3})
        self.step += 1


def follow_tracer(current: StepTrace | None, reducer: Any,
                  algorithms: Sequence[str]) -> StepTrace | None:
    """The StepTrace a DDP model's Reducer should carry now (DDP's forward asks every step).

    Tracing may start (or restart) at any time after the model was built: on the first step
    under a new Tracer, a StepTrace for it replaces ``current`` among the Reducer's observers.
    Otherwise ``current`` is returned unchanged (None while tracing was never on).
    """
    tr = trace.active
    if tr is None or (current is not None and current.tracer is tr):
        return current
    if current is not None:
        reducer.remove_observer(current)
    new = StepTrace(tr, algorithms, reducer.overlap)
    new.step = reducer.num_syncs
    reducer.add_observer(new)
    return new


__all__ = ["StepStats", "StepTrace", "follow_tracer"]
