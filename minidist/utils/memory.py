"""Where a rank's memory goes: parameters, gradients, buckets, optimizer state, activations.

    from minidist.utils import memory_report
    report = memory_report(ddp_model, optimizer, step=lambda: loss_fn(ddp_model(x), y).backward())
    print(report)                      # one rank's table; report.as_dict() for JSON

Static parts are counted from the arrays themselves (``nbytes``): each parameter's ``.data``;
``.grad`` arrays that own their memory (a gradient that is a view of a DDP bucket is counted
once, in the bucket); DDP's bucket buffers (``model.buckets``) plus a ZeRO optimizer's own
communication buffers (``optimizer.comm_buffers_nbytes()``); the arrays in
``optimizer.state`` (for ZeRO: this rank's shard only). Activations are measured: ``step()``
(forward + backward; leave the optimizer step out) runs once under ``tracemalloc`` and the
peak above the memory in use before it is reported: the saved activations plus the
temporaries of backward. tracemalloc sees host (NumPy) memory only; on a GPU the activation
column is not meaningful.
"""

from __future__ import annotations

import gc
import tracemalloc
from dataclasses import asdict, dataclass
from typing import Any, Callable

_MiB = float(1 << 20)


@dataclass
class MemoryReport:
    """Bytes held by one rank, by kind (see the module docstring for what each counts)."""

    parameters: int = 0
    gradients: int = 0
    buckets: int = 0
    optimizer_state: int = 0
    peak_activations: int | None = None

    def as_dict(self) -> dict[str, int | None]:
        return asdict(self)

    def __str__(self) -> str:
        rows = [("parameters", self.parameters), ("gradients (own arrays)", self.gradients),
                ("buckets (DDP/ZeRO buffers)", self.buckets),
                ("optimizer state", self.optimizer_state),
                ("peak activations (step)", self.peak_activations)]
        lines = [f"{'memory of this rank':28s} {'MiB':>10s}"]
        lines += [f"{name:28s} {'-' if v is None else f'{v / _MiB:10.3f}':>10s}"
                  for name, v in rows]
        return "\n".join(lines)


def _nbytes(arrays: Any) -> int:
    return int(sum(a.nbytes for a in arrays if hasattr(a, "nbytes")))


def static_memory(model: Any, optimizer: Any = None) -> MemoryReport:
    """The counted (not measured) part of :func:`memory_report`."""
    params = list(model.parameters())
    grads = [p.grad for p in params
             if p.grad is not None and getattr(p.grad, "base", None) is None]
    buckets = _nbytes(b.buffer for b in getattr(model, "buckets", ()) if b.buffer is not None)
    state = 0
    if optimizer is not None:
        state = _nbytes(v for s in optimizer.state.values() for v in s.values())
        extra = getattr(optimizer, "comm_buffers_nbytes", None)
        buckets += int(extra()) if callable(extra) else 0
    return MemoryReport(parameters=_nbytes(p.data for p in params), gradients=_nbytes(grads),
                        buckets=buckets, optimizer_state=state)


def peak_step_bytes(step: Callable[[], Any]) -> int:
    """Peak host memory allocated by ``step()`` above what was in use when it started."""
    gc.collect()
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        step()
        return max(tracemalloc.get_traced_memory()[1] - base, 0)
    finally:
        if not was_tracing:
            tracemalloc.stop()


def memory_report(model: Any, optimizer: Any = None, step: Callable[[], Any] | None = None
                  ) -> MemoryReport:
    """This rank's memory by kind; with ``step``, also the peak of one forward + backward.

    Args:
        model: a Module or a DistributedDataParallel (its buckets are counted).
        optimizer: any optimizer (its ``state`` arrays are counted), e.g. a
            ZeroRedundancyOptimizer (only this rank's shard).
        step: runs one forward + backward (no optimizer step); measured with tracemalloc.

    Returns:
        A :class:`MemoryReport` (``print`` it for a table, ``as_dict()`` for JSON). The
        static columns are counted after ``step`` ran, so the gradients and buckets it
        creates are included.

    Example::

        >>> from minidist import nn
        >>> from minidist.tensor import Tensor
        >>> net = nn.Linear(1000, 10)
        >>> memory_report(net).parameters
        40040
    """
    peak = peak_step_bytes(step) if step is not None else None
    report = static_memory(model, optimizer)
    report.peak_activations = peak
    return report
