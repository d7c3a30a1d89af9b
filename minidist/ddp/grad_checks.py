"""Checks on gradients around the reduction that DDP's correctness needs.

    missing_gradients_error(buckets, unreduced, step)   # a bucket never filled: which params
    bypassed_error(name, step)                          # backward through the inner model
    unused_param_indices(out, params, parents)          # find_unused_parameters

The NaN/inf check of the averaged gradients (``nonfinite_grads="warn"``, DDP's default) is
the watch wing's (minidist/watch/nonfinite.py): a Reducer observer it builds for each DDP
model through ``reducer.NONFINITE_CHECK``.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from minidist.logger import rank_prefix

NONFINITE_POLICIES = ("warn", "raise", "ignore")
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


__all__ = ["NONFINITE_POLICIES", "bypassed_error", "missing_gradients_error",
           "unused_param_indices"]
