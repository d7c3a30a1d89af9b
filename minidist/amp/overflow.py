"""Reports of skipped steps: which parameter overflowed first, and the scale-floor warning.

    report = OverflowReport()
    report.skipped(step=12, first="'fc2.weight'", scale=65536.0, backoff_factor=0.5)   # INFO
    report.check_floor(scale=0.5)          # WARNING once, when the scale fell below SCALE_FLOOR

A skipped step is a normal event under dynamic loss scaling (the scale was too high), so each
is logged at INFO level only. A scale below ``SCALE_FLOOR`` is not normal: the gradients
overflow even unscaled. That is reported once, naming the parameter that overflowed first most
often. ``first_nonfinite`` finds that parameter, in backward order, without a host round trip
on steps that were not skipped (it only runs on skipped ones).
"""

from __future__ import annotations

import collections
from typing import Any, Iterable, Sequence

from minidist import xp as backend
from minidist.logger import get_logger

log = get_logger(__name__)

SCALE_FLOOR = 1.0
"""Warn once when the scale backs off below this (torch has no floor and no warning): a scale
below 1 means the gradients overflow even UNscaled, so loss scaling cannot help; the run is
diverging, and the warning names the parameter that overflowed first most often."""


_OP = "GradScaler.step (naming the overflowing parameter of a skipped step)"


def _finite(a: Any) -> bool:
    return bool(backend.to_host(backend.get_array_module(a).isfinite(a).all(), op=_OP))


def first_nonfinite(buckets: Iterable[tuple[Any, Sequence[Any], Sequence[str]]],
                    params: Sequence[Any], covered: set[int]) -> str:
    """Name the first parameter, in backward order, whose (unscaled) gradient is inf/NaN.

    Args:
        buckets: ``(found_inf, targets, names)`` of each bucket DDP unscaled, in reduction
            order (= backward order); only flagged buckets are searched.
        params: the optimizer's parameters, in its order (backward reaches the last first).
        covered: ids of the parameters a bucket covered (not searched again).
    """
    for found_inf, targets, names in buckets:
        if float(backend.to_host(found_inf, op=_OP)[0]) == 0.0:
            continue
        for k, t in enumerate(targets):
            if t.grad is not None and not _finite(t.grad):
                return repr(names[k]) if k < len(names) else f"a parameter of shape {t.shape}"
    for i in range(len(params) - 1, -1, -1):
        p = params[i]
        if id(p) not in covered and p.grad is not None and not _finite(p.grad):
            return f"parameter #{i} of the optimizer (shape {p.shape})"
    return "unknown (the flag was set but no gradient holds inf/NaN now)"


class OverflowReport:
    """Counts skipped steps and which parameter overflowed first in each."""

    def __init__(self) -> None:
        self.num_skipped = 0
        self._first: collections.Counter = collections.Counter()
        self._floor_warned = False

    def skipped(self, step: int, first: str, scale: float, backoff_factor: float) -> None:
        """One skipped step (INFO: expected now and then under dynamic loss scaling)."""
        self.num_skipped += 1
        self._first[first] += 1
        log.info("GradScaler: inf/NaN gradient at step %d (first, in backward order: %s); "
                 "optimizer step skipped, scale %g -> %g", step, first, scale,
                 scale * backoff_factor)

    def check_floor(self, scale: float) -> None:
        """Warn once when the scale is below ``SCALE_FLOOR`` after skipped steps."""
        if self._floor_warned or self.num_skipped == 0 or scale >= SCALE_FLOOR:
            return
        self._floor_warned = True
        name, count = self._first.most_common(1)[0]
        log.warning(
            "GradScaler: the loss scale fell to %g (below %g) after %d skipped steps: the "
            "gradients overflow even without scaling, so loss scaling cannot help. The "
            "parameter that overflowed first most often is %s (%d of %d skipped steps). Lower "
            "the learning rate, clip gradients, or check the inputs and that layer for inf/NaN "
            "(this warning is shown once).", scale, SCALE_FLOOR, self.num_skipped, name, count,
            self.num_skipped)
