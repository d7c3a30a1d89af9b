"""Checks on gradients around the reduction that DDP's correctness needs, and AMP's unscale.

    AmpUnscale(scaler)                                  # a GradScaler's unscale-on-reduce
    ReducerExtras                                       # the Reducer's NaN/inf check, AMP,
                                                        # find_unused_parameters
    bucket_failed_error(bucket, err, step)              # an all-reduce raised
    missing_gradients_error(buckets, unreduced, step)   # a bucket never filled: which params
    bypassed_error(name, step)                          # backward through the inner model
    unused_param_indices(out, params, parents)          # find_unused_parameters

The NaN/inf check of the averaged gradients (``nonfinite_grads="warn"``, DDP's default) is
the watch wing's (minidist/watch/nonfinite.py): a Reducer observer it builds for each DDP
model through ``reducer.NONFINITE_CHECK``.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from minidist.comm.advice import failure_advice, sentence
from minidist.ddp.observers import ReducerObserver
from minidist.ddp.states import StepState
from minidist.logger import get_logger, rank_prefix

log = get_logger("minidist.ddp.reducer")  # mark_unused's lines are the Reducer's

NONFINITE_POLICIES = ("warn", "raise", "ignore")


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
        if self.scaler.unscale_bucket_(bucket.buffer, bucket.params, bucket.names,
                                       bucket.spec.offsets):
            bucket.finite = True


class ReducerExtras:
    """Mixin of the Reducer (reducer.py): the NaN/inf check of the averaged gradients and a
    GradScaler's unscale (observers, observers.py), and ``find_unused_parameters``' early
    ready."""

    rank: int
    step_state: StepState
    _step_observers: list
    _nonfinite: Any
    _nonfinite_policy: str
    num_syncs: int
    _unused: list[int]
    _grad_ready: Callable[[int], None]
    add_observer: Callable[..., None]
    remove_observer: Callable[..., None]

    @property
    def nonfinite_grads(self) -> str:
        """The NaN/inf policy: "warn", "raise" or "ignore" (no check is registered then)."""
        return self._nonfinite_policy

    @nonfinite_grads.setter
    def nonfinite_grads(self, policy: str) -> None:
        if self._nonfinite is not None:
            self.remove_observer(self._nonfinite)
        from minidist.ddp import reducer  # the seam the watch wing fills
        make = reducer.NONFINITE_CHECK
        if policy == "raise" and make is None:
            raise ValueError(f"{rank_prefix()} DistributedDataParallel: nonfinite_grads='raise' "
                             "needs the NaN/inf check of the watch wing, which MINIDIST_WINGS "
                             "leaves out; unset MINIDIST_WINGS or add watch to it.")
        self._nonfinite = None if policy == "ignore" or make is None else make(policy, self.rank)
        self._nonfinite_policy = policy if self._nonfinite is not None else "ignore"
        if self._nonfinite is not None:
            self.add_observer(self._nonfinite)

    @property
    def nonfinite_grad_steps(self) -> int:
        """Synced steps whose reduced gradients held NaN/inf (counted by the check)."""
        return self._nonfinite.steps if self._nonfinite is not None else 0

    def watch_output(self, output: Any) -> None:
        """Keep a reference to this forward's output (no copy, no check: free); checked only
        if a reduced gradient turns out non-finite, to name the ranks where it started."""
        if self._nonfinite is not None:
            self._nonfinite.watch(output)

    def _use_scaler(self, scaler: Any) -> None:
        """A GradScaler scaled this step's loss: unscale each bucket after its reduction."""
        if self.step_state is not StepState.IDLE:
            for o in self._step_observers:
                if isinstance(o, AmpUnscale):
                    self.remove_observer(o)
            self.add_observer(AmpUnscale(scaler), step=True)

    def mark_unused(self, unused: Sequence[int]) -> None:
        """Mark parameters that will get no gradient this step as ready (reduced as they are).

        Their bucket slots keep what they hold: zeros after ``zero_grad``, or the gradient
        accumulated under ``no_sync``. Called right after forward, before backward starts.
        """
        if self.step_state is StepState.IDLE:
            return
        self._unused = list(unused)
        for i in unused:
            self._grad_ready(i)
        if unused:
            log.debug("step %d: %d unused parameter(s) marked ready", self.num_syncs, len(unused))


def missing_gradients_error(buckets: Sequence[Any], unreduced: Sequence[Any], step: int,
                            find_unused_parameters: bool) -> RuntimeError:
    """The error of a synced backward that ended with buckets never ready (Reducer)."""
    missing = [n for b in buckets for n in b.missing_names()]
    why = ("They are in the autograd graph of the output but received no gradient"
           if find_unused_parameters else
           "These parameters were not used to compute the loss on this rank")
    return RuntimeError(
        f"{rank_prefix()} DistributedDataParallel: backward of step {step} "
        f"finished without a gradient for {len(missing)} parameter(s): {missing[:8]}"
        f"{'...' if len(missing) > 8 else ''}, so bucket(s) {[b.index for b in unreduced]} were "
        f"never all-reduced and this step's gradients are not averaged. {why}. Pass "
        "find_unused_parameters=True to DistributedDataParallel (they are then reduced as "
        "zeros), or remove them from the model; if you call backward more than once per "
        "step, run all but the last inside no_sync().")


def bucket_failed_error(bucket: Any, err: BaseException, step: int) -> RuntimeError:
    """The error of a bucket whose all-reduce raised (Reducer), with the advice for ``err``."""
    return RuntimeError(
        f"{rank_prefix()} DistributedDataParallel: all-reduce of bucket {bucket.index} "
        f"({bucket.spec.numel} x {bucket.spec.dtype}, parameters {bucket.names[:4]}"
        f"{'...' if len(bucket.names) > 4 else ''}) failed at step {step}: "
        f"{type(err).__name__}: {sentence(str(err))}. {failure_advice(err)}.")


def bypassed_error(name: str, step: int) -> RuntimeError:
    """A gradient reached a DDP parameter in a backward that no DDP forward prepared: the
    inner model was called, so the buckets never saw this backward (Reducer's hook)."""
    return RuntimeError(
        f"{rank_prefix()} DistributedDataParallel: parameter {name!r} got a gradient in a "
        f"backward (after step {step}) that did not follow a forward through the DDP wrapper: "
        "the wrapped module was called directly (model(x) instead of ddp(x)), so this "
        "gradient would not be averaged and the ranks' weights would drift apart in silence. "
        "Call the wrapper (out = ddp(x)); for a forward outside training, use no_grad(). A "
        "second backward over one forward's graph lands here too: run forward again.")


def unused_param_indices(outputs: Any, params: Sequence[Any],
                         parents: Callable[[Any], Sequence[Any]]) -> list[int]:
    """Indices of ``params`` the autograd graph of ``outputs`` does not reach.

    Args:
        outputs: a Tensor, or a (nested) tuple/list/dict of them, as returned by forward.
        params: the parameters, in registration order.
        parents: returns the input tensors a tensor was computed from.
    """
    stack: list[Any] = []

    def collect(o: Any) -> None:
        if isinstance(o, (list, tuple)):
            for x in o:
                collect(x)
        elif isinstance(o, dict):
            for x in o.values():
                collect(x)
        elif hasattr(o, "array") and hasattr(o, "grad"):
            stack.append(o)

    collect(outputs)
    seen: set[int] = set()
    while stack:
        t = stack.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        stack.extend(parents(t))
    return [i for i, p in enumerate(params) if id(p) not in seen]


__all__ = ["AmpUnscale", "NONFINITE_POLICIES", "ReducerExtras", "bucket_failed_error",
           "bypassed_error", "missing_gradients_error", "unused_param_indices"]
