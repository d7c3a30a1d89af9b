"""The NaN/inf check of DDP's averaged gradients: a Reducer observer from the watch wing.

    NonfiniteCheck("warn", rank)          # DDP's default (nonfinite_grads="warn")
    all_finite_fast(bucket.buffer)        # one dot product: True, or "maybe not" (search then)
    nonfinite_names(buckets)              # the parameters whose reduced gradient holds NaN/inf
    where_it_started(outputs, rank, n, all_reduce)   # which ranks' forward was non-finite

The wing hands the Reducer this class through ``minidist.ddp.reducer.NONFINITE_CHECK`` when it
loads (minidist/watch/attach.py); without the wing no check runs.

With a GradScaler (mixed precision, minidist.amp): ``scaler.scale(loss)`` registers the
scaler's observer for the step (observers.AmpUnscale); each bucket is UNSCALED right after its
all-reduce by the scaler's fused kernel (``unscale_bucket_``: unscale + inf/NaN flag in one
pass), in place of the finiteness dot product, so AMP adds no pass over the gradients. The
flags are identical on every rank (the buckets are), so every rank skips the same steps. The
scaler, not the reducer, then reports an inf/NaN (it is expected now and then: the scale was
too high).

Without a scaler, a NaN/inf after the reduction is reported once (warning) and then counted
(``nonfinite_grad_steps``). Every rank sees the same reduced buckets, so all ranks take that
slow path together, and it may run one small all-reduce: which ranks' forward outputs were
already non-finite (the references kept by ``watch_output``; nothing is checked on the fast
path), so the message can name the rank(s) where the NaN/inf started.
"""

from __future__ import annotations

import collections
from typing import Any, Callable, Sequence

import numpy as np

from minidist import xp as backend
from minidist.ddp.observers import ReducerObserver
from minidist.logger import get_logger, rank_prefix

log = get_logger("minidist.ddp.reducer")  # the Reducer's reports: one logger name for them

_MAX_WATCHED_OUTPUTS = 64  # forward outputs kept between syncs (no_sync micro-batches)


class NonfiniteCheck(ReducerObserver):
    """The NaN/inf check of the averaged gradients, a Reducer observer (on by default).

    After each reduction: one dot product per bucket (``all_finite_fast``), unless a
    GradScaler already unscaled and checked it, or the shared-memory all-reduce checked it
    while it reduced it (``group.shared_memory.reduced_finite``: each rank its own slice, in
    cache, the verdicts exchanged in the headers; DDP's buckets at n ranks on one node). At
    the end of the step, only if a bucket may hold NaN/inf: name the parameters, ask every
    rank whether its forward output was already non-finite (one small all-reduce: every rank
    takes this path together, the reduced buckets being identical), then warn once and
    count, or raise.

    Args:
        policy: "warn" (once, then count in ``steps``) or "raise" (FloatingPointError).
        rank: this process's rank in the group (names the ranks in the report).
    """

    def __init__(self, policy: str, rank: int) -> None:
        self.policy = policy
        self.rank = rank
        self.steps = 0  # synced steps whose reduced gradients held NaN/inf
        # forward outputs since the last sync (see watch); bounded: only a reference each
        self.outputs: collections.deque = collections.deque(maxlen=_MAX_WATCHED_OUTPUTS)

    def watch(self, output: Any) -> None:
        """Keep a reference to a forward output's arrays (no copy, no check: free); they are
        checked only if a reduced gradient turns out non-finite."""
        self.outputs.extend(float_arrays(output))

    def bucket_reduced(self, bucket: Any) -> None:
        if bucket.finite is None:  # not unscaled (and checked) by a GradScaler
            # the shared-memory all-reduce checked each slice as it finished it, in cache
            # (the fast path's group.shared_memory); any other algorithm: one pass here
            shared = getattr(bucket.group, "shared_memory", None)
            verdict = None if shared is None else shared.reduced_finite(bucket.buffer)
            bucket.finite = all_finite_fast(bucket.buffer) if verdict is None else verdict

    def step_end(self, reducer: Any) -> None:
        if not all(b.finite for b in reducer.buckets):
            self.report(reducer)
        self.outputs.clear()

    def report(self, reducer: Any) -> None:
        """The slow path: some bucket may hold NaN/inf (all ranks are here together)."""
        bad = nonfinite_names(reducer.buckets)
        if bad:
            self.steps += 1
            started = where_it_started(self.outputs, self.rank, reducer.world_size,
                                       reducer.buckets[0].all_reduce)
            report_nonfinite(bad, reducer.num_syncs - 1, started, self.policy, self.steps)


def report_nonfinite(bad: list[str], step: int, started: str, policy: str, count: int) -> None:
    """Raise (``policy="raise"``), warn once, or count a step with NaN/inf averaged gradients."""
    msg = (f"{rank_prefix()} DistributedDataParallel: non-finite (NaN/inf) averaged gradient "
           f"at step {step} in {bad[:8]}{'...' if len(bad) > 8 else ''}; {started}. Lower the "
           "learning rate, clip gradients, or check the inputs of that step.")
    if policy == "raise":
        raise FloatingPointError(msg)
    if count == 1:
        log.warning("%s Warned once: later non-finite steps are only counted "
                    "(DistributedDataParallel.nonfinite_grad_steps).", msg)
    else:
        log.debug("%s (non-finite step %d)", msg, count)


def nonfinite_names(buckets: Sequence[Any]) -> list[str]:
    """Names of the parameters whose gradient holds NaN/inf, in the buckets not known finite."""
    bad: list[str] = []
    for b in buckets:
        if b.finite is not False:
            continue
        xp = backend.get_array_module(b.buffer)
        bad += [n for n, v in zip(b.names, b.views) if not bool(xp.isfinite(v).all())]
    return bad


def where_it_started(outputs: Sequence[Any], rank: int, world_size: int,
                     all_reduce: Callable[[Any, str], None]) -> str:
    """Which ranks' forward outputs were non-finite this step (one all-reduce of n flags)."""
    flags = np.zeros(max(world_size, 1), dtype=np.float64)
    finite = all(bool(backend.get_array_module(a).isfinite(a).all()) for a in outputs)
    flags[rank] = 0.0 if finite else 1.0
    if world_size > 1:
        all_reduce(flags, "sum")
    ranks = [r for r in range(len(flags)) if flags[r] > 0]
    if ranks:
        return (f"it started on rank(s) {ranks}, whose forward output was already "
                "non-finite (look at the input batch there, or the weights)")
    return ("every rank's forward output was finite, so it arose in backward (a gradient "
            "overflowed on some rank) or in the sum of the all-reduce")


def all_finite_fast(buf: Any) -> bool:
    """True if ``buf`` holds no NaN/inf; False means "maybe": search it exactly then.

    One BLAS dot product ``buf . buf`` (a single vectorized read of the buffer, faster than
    ``buf.sum()`` and no boolean temporary like ``isfinite(buf).all()``): a NaN or inf
    element makes it NaN/inf, and the squares are >= 0, so nothing cancels. It can also overflow
    for finite values above ~1e19 (float32): a false "maybe", which the exact search clears.
    float16 is summed in float32 (no half-precision BLAS). Integers are always finite (the
    product may wrap around, but ``isfinite`` of an integer is True).
    """
    with np.errstate(over="ignore", invalid="ignore"):  # overflow = "maybe", not a warning
        return bool(np.isfinite(buf.dot(buf) if buf.dtype.itemsize >= 4 else
                                buf.sum(dtype=np.float32)))


def float_arrays(output: Any) -> list[Any]:
    """The float arrays of the Tensors in a forward output (a Tensor, or nested list/dict)."""
    if isinstance(output, (list, tuple)):
        return [a for o in output for a in float_arrays(o)]
    if isinstance(output, dict):
        return [a for o in output.values() for a in float_arrays(o)]
    data: Any = getattr(output, "array", None)
    return [data] if hasattr(data, "dtype") and data.dtype.kind == "f" else []


__all__ = ["NonfiniteCheck", "all_finite_fast", "float_arrays", "nonfinite_names",
           "report_nonfinite", "where_it_started"]
