"""Where a rank's memory goes: parameters, gradients, buckets, optimizer state, activations.

    from minidist.utils import memory_report
    report = memory_report(ddp_model, optimizer, step=lambda: loss_fn(ddp_model(x), y).backward())
    print(report)                      # one rank's table; report.as_dict() for JSON

Static parts are counted from the arrays themselves (``nbytes``): each parameter's ``.array``;
``.grad`` arrays that own their memory (a gradient that is a view of a DDP bucket is counted
once, in the bucket); DDP's bucket buffers (``model.buckets``) plus a ZeRO optimizer's own
communication buffers (``optimizer.comm_buffers_nbytes()``); the arrays in
``optimizer.state`` (for ZeRO: this rank's shard only). Activations are measured under
``tracemalloc``, above the memory in use before ``step()`` runs (leave the optimizer step
out of it):

    activations_kept   step() returned the loss (forward only): what is alive while it
                       is held, i.e. what the tape keeps for backward; then loss.backward()
    peak_activations   the peak through forward AND backward: the kept activations plus
                       backward's temporaries (and, checkpointed, one segment recomputed)

tracemalloc sees host (NumPy) memory only; on a GPU the activation columns are not meaningful.
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
    activations_kept: int | None = None
    peak_activations: int | None = None

    def as_dict(self) -> dict[str, int | None]:
        return asdict(self)

    def __str__(self) -> str:
        rows = [("parameters", self.parameters), ("gradients (own arrays)", self.gradients),
                ("buckets (DDP/ZeRO buffers)", self.buckets),
                ("optimizer state", self.optimizer_state),
                ("activations kept (forward)", self.activations_kept),
                ("peak activations (fwd+bwd)", self.peak_activations)]
        lines = [f"{'memory of this rank':28s} {'MiB':>10s}"]
        lines += [f"{name:28s} {'-' if v is None else f'{v / _MiB:10.3f}':>10s}"
                  for name, v in rows]
        return "\n".join(lines)


def _nbytes(arrays: Any) -> int:
    return int(sum(a.nbytes for a in arrays if hasattr(a, "nbytes")))


def static_memory(model: Any, optimizer: Any = None) -> MemoryReport:
    """The counted (not measured) part of :func:`memory_report`."""
    params = list(model.parameters())
    grads = [p.grad.array for p in params
             if p.grad is not None and getattr(p.grad.array, "base", None) is None]
    buckets = _nbytes(b.buffer for b in getattr(model, "buckets", ()) if b.buffer is not None)
    state = 0
    if optimizer is not None:
        state = _nbytes(v for s in optimizer.state.values() for v in s.values())
        extra = getattr(optimizer, "comm_buffers_nbytes", None)
        buckets += int(extra()) if callable(extra) else 0
    return MemoryReport(parameters=_nbytes(p.array for p in params), gradients=_nbytes(grads),
                        buckets=buckets, optimizer_state=state)


def measure_step(step: Callable[[], Any]) -> tuple[int | None, int]:
    """(kept, peak) host bytes of ``step()`` above what was in use when it started.

    If ``step()`` returns a loss (anything with ``.backward``), ``kept`` is measured while it
    is alive and then ``loss.backward()`` runs inside the measurement; otherwise kept is None.
    """
    gc.collect()
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        loss = step()
        kept = None
        if hasattr(loss, "backward"):
            kept = max(tracemalloc.get_traced_memory()[0] - base, 0)
            loss.backward()
            del loss
        return kept, max(tracemalloc.get_traced_memory()[1] - base, 0)
    finally:
        if not was_tracing:
            tracemalloc.stop()


def memory_report(model: Any, optimizer: Any = None, step: Callable[[], Any] | None = None
                  ) -> MemoryReport:
    """This rank's memory by kind; with ``step``, also its activations (measured).

    Args:
        model: a Module or a DistributedDataParallel (its buckets are counted).
        optimizer: any optimizer (its ``state`` arrays are counted), e.g. a
            ZeroRedundancyOptimizer (only this rank's shard).
        step: runs one forward and returns the loss (then ``activations_kept`` is measured
            too, and the report calls ``loss.backward()``), or runs forward + backward itself
            and returns None. No optimizer step. Measured with tracemalloc.

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
    kept, peak = measure_step(step) if step is not None else (None, None)
    report = static_memory(model, optimizer)
    report.activations_kept, report.peak_activations = kept, peak
    return report
