"""What DistributedDataParallel offers beyond the textbook step: torch's surface and the extras.

DistributedDataParallel (ddp.py: construction, forward, no_sync, comm hooks) inherits this
mixin, which inherits ``ModulePassThrough`` (passthrough.py: ``parameters``, ``state_dict``,
... of the wrapped module, with torch's ``module.`` prefix)::

    with model.join():                                # uneven inputs: ranks may run out of
        for x, y in my_batches:                       # batches at different steps (join.py)
            ...
    model.require_backward_grad_sync = False          # torch's flag (nanoGPT): as no_sync
    model.last_step_stats                             # {"wait_s": ..., "comm_s": ...}
    model.nonfinite_grad_steps                        # steps whose averaged grads held NaN/inf
    model.close(release_buffers=True)                 # also free the bucket buffers now

torch's constructor arguments that minidist accepts so that a torch call ports unchanged:

    device_ids          torch's one-device-per-process form: None (CPU modules, or "where the
                        parameters are"), or a one-element list naming the GPU that holds the
                        parameters (``[local_rank]``, ``["cuda:1"]``); anything else raises
                        ValueError (options.py ``check_device_ids``)
    output_device       None, or the same device as ``device_ids[0]``
    dim                 torch's scatter dimension for multi-device modules; unused (one device
                        per rank)
    init_sync           torch's name for broadcasting rank 0's parameters and buffers at start;
                        ``broadcast_parameters`` is minidist's older name (both must be True)
    check_reduction     ignored (deprecated in torch too)
    gradient_as_bucket_view   accepted; minidist's gradients are always views into the buckets
                        (torch's ``True`` behaviour)
    static_graph        accepted and recorded; minidist does not specialise on it
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from minidist import comm
from minidist.ddp.buffers import broadcast_buffer_packs
from minidist.ddp.hooks import averages_plainly
from minidist.ddp.join import Join
from minidist.ddp.passthrough import ModulePassThrough
from minidist.ddp.timeline import StepStats
from minidist.logger import rank_prefix


class DDPSurface(ModulePassThrough):
    """Mixin of DistributedDataParallel: join, torch's flag, the step's statistics."""

    module: Any
    reducer: Any
    buckets: list
    process_group: Any
    world_size: int
    _join: Join | None
    _stats: StepStats | None
    _buffer_packs: list

    @property
    def require_backward_grad_sync(self) -> bool:
        """torch's flag (nanoGPT sets it): False before a forward skips averaging, as no_sync."""
        return self.reducer.require_sync

    @require_backward_grad_sync.setter
    def require_backward_grad_sync(self, value: bool) -> None:
        self.reducer.require_sync = bool(value)

    @contextlib.contextmanager
    def join(self, divide_by_initial_world_size: bool = False, enable: bool = True,
             throw_on_early_termination: bool = False) -> Iterator[None]:
        """Train on uneven inputs: ranks may run out of batches at different steps.

        A rank that leaves the block shadows its peers' steps until all have left (join.py
        shows the schedule); each step's gradients are divided by the number of ranks that
        trained it.

        Args:
            divide_by_initial_world_size: divide by the world size instead (torch's default
                is True; minidist's is False: the exact average over the real batches).
            enable: False turns the block into a no-op (torch's flag).
            throw_on_early_termination: not supported (ValueError if True).

        Raises:
            ValueError: ``throw_on_early_termination=True``, or a comm hook is registered
                (the shadow step runs the plain all-reduce only).
        """
        if throw_on_early_termination:
            raise ValueError(f"{rank_prefix()} DistributedDataParallel.join: "
                             "throw_on_early_termination=True is not supported; use the "
                             "default (ranks that run out of batches shadow the others).")
        if not averages_plainly(self.reducer.comm_hook):
            raise ValueError(f"{rank_prefix()} DistributedDataParallel.join: a comm hook "
                             f"({getattr(self.reducer.comm_hook, '__name__', '?')}) is "
                             "registered; join shadows the plain all-reduce only. Remove the "
                             "hook for training on uneven inputs.")
        if not enable or self.world_size == 1:
            yield
            return
        self._join = Join(divide_by_initial_world_size, self._shadow_step,
                          self._broadcast_state)  # type: ignore[attr-defined]
        finished = False
        try:
            yield
            finished = True
        finally:
            join, self._join = self._join, None
            self.reducer.divisor = self.world_size
        if finished:  # an exception ends the job through the excepthook: no shadowing then
            join.shadow_until_all_joined(self)

    @property
    def joining(self) -> bool:
        """True inside ``join()``: the ranks may hand out different numbers of batches."""
        return self._join is not None  # type: ignore[attr-defined]

    def _shadow_step(self, divisor: int) -> None:
        """The collectives of one synced step, contributing nothing (see ``join``): the comm
        hook on zero buckets, with the training ranks' ``divisor`` (so it makes the same calls)."""
        if self._buffer_packs:
            broadcast_buffer_packs(self._buffer_packs, self.process_group)
        for b in self.buckets:
            b.buffer[...] = 0
            b.divisor = divisor
            b.label = b.name  # a shadow has no batch: the training ranks' label inside join
            self.reducer.comm_hook(self.reducer.hook_state, b)

    @property
    def nonfinite_grad_steps(self) -> int:  # steps whose averaged grads held NaN/inf (no scaler)
        return self.reducer.nonfinite_grad_steps

    @property
    def last_step_stats(self) -> dict[str, float]:
        """Seconds of the last synced backward: ``wait_s`` (exposed comm), ``comm_s`` (busy).

        Timing is an observer of the Reducer (timeline.StepStats), registered by the first
        read: that read returns zeros, every later one the step before it."""
        if self._stats is None:
            self._stats = StepStats(self.reducer.overlap)
            self.reducer.add_observer(self._stats)
        return dict(self._stats.stats)

    def _release_buffers(self) -> None:
        """``close(release_buffers=True)``: free the bucket buffers' shared-memory windows now
        instead of at process exit (for programs that build many DDP models, like the
        benchmarks). COLLECTIVE: every rank must call it. Gradients that are bucket views are
        copied out first, so ``p.grad`` stays readable."""
        group = self.process_group or comm.get_default_group()
        for b in self.buckets:
            for p, view in zip(b.params, b.views):
                if p.grad is not None and p.grad.array is view:
                    p.grad = view.copy()
            buf, b.buffer, b.views = b.buffer, None, []
            group.free_buffer(buf)
        self.buckets = []


__all__ = ["DDPSurface"]
