"""``MINIDIST_DEBUG``: a log line per all-reduce, and "auto" explained beside its measured time.

    group.calls.add(DebugLog(group))    # ProcessGroup does it when MINIDIST_DEBUG >= 1

An observer of the group's calls (comm/calls.py). ``start`` logs which algorithm an all-reduce
runs (``all_reduce: auto ran shm on 1024 x float32 ...``); ``end`` hands the call's time to
``select.Explainer``, which logs once per size class what "auto" chose, why, and the predicted
beside the measured time (``ProcessGroup.farewell`` flushes the classes not logged yet).
"""

from __future__ import annotations

from time import perf_counter
from typing import Any

import numpy as np

from minidist.comm.algorithms.select import Explainer
from minidist.comm.calls import Call
from minidist.logger import get_logger

log = get_logger("minidist.comm.group")  # the logger these lines always came from


class DebugLog:
    """The observer (see the module docstring); ``explainer`` is the group's ``Explainer``."""

    def __init__(self, group: Any, explainer: Explainer) -> None:
        self.group = group
        self.explainer = explainer
        self._t0: dict[int, float] = {}  # id(call) -> perf_counter at start

    def start(self, call: Call) -> None:
        """Log the algorithm an all-reduce runs."""
        spec = call.spec
        if spec.collective != "all_reduce":
            return
        nbytes = spec.numel * np.dtype(spec.dtype).itemsize
        log.debug("all_reduce: %s ran %s on %d x %s (%d bytes, op=%s, n=%d)", spec.requested,
                  spec.algorithm, spec.numel, np.dtype(spec.dtype).name, nbytes,
                  spec.op.value if spec.op is not None else None, self.group.size)
        self._t0[id(call)] = perf_counter()

    def end(self, call: Call) -> None:
        """Give "auto"'s explainer the call's time."""
        t0 = self._t0.pop(id(call), None)
        spec = call.spec
        if t0 is not None and spec.requested == "auto":
            self.explainer.add(spec.algorithm or "", spec.reason or "",
                               spec.numel * np.dtype(spec.dtype).itemsize, spec.shared,
                               perf_counter() - t0)

    def failed(self, call: Call, error: BaseException) -> None:
        """Forget the call's start time."""
        self._t0.pop(id(call), None)


__all__ = ["DebugLog"]
