"""``MINIDIST_DEBUG``: a log line per all-reduce.

    group.calls.add(DebugLog(group))    # ProcessGroup does it when MINIDIST_DEBUG >= 1

An observer of the group's calls (comm/calls.py). ``start`` logs which algorithm an all-reduce
runs (``all_reduce: auto ran shm on 1024 x float32 ...``). The auto wing adds its own observer
beside it, which logs once per size class what "auto" chose, why, and the predicted beside the
measured time (minidist/auto/choice.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minidist.comm.calls import Call, CollectiveObserver
from minidist.logger import get_logger

log = get_logger("minidist.comm.group")  # the logger these lines always came from


class DebugLog(CollectiveObserver):
    """The observer (see the module docstring): ``start`` only."""

    def __init__(self, group: Any) -> None:
        self.group = group

    def start(self, call: Call) -> None:
        """Log the algorithm an all-reduce runs."""
        spec = call.spec
        if spec.collective != "all_reduce":
            return
        nbytes = spec.numel * np.dtype(spec.dtype).itemsize
        log.debug("all_reduce: %s ran %s on %d x %s (%d bytes, op=%s, n=%d)", spec.requested,
                  spec.algorithm, spec.numel, np.dtype(spec.dtype).name, nbytes,
                  spec.op.value if spec.op is not None else None, self.group.size)


__all__ = ["DebugLog"]
