"""DistributedDataParallel: wrap a model so every rank ends each step with the same parameters.

    import minidist
    from minidist import comm
    comm.init_process_group()                         # ./mpirun.sh -n 4 python train.py
    model = minidist.DistributedDataParallel(build_model())
    for x, y in loader:                               # each rank: its own shard of the data
        loss = loss_fn(model(x), y)
        loss.backward()                               # returns with every grad AVERAGED
        opt.step(); opt.zero_grad()                   # same grads -> same update everywhere

    with model.no_sync():                             # gradient accumulation: no communication
        loss_fn(model(x1), y1).backward()             # grads add up locally
    loss_fn(model(x2), y2).backward()                 # this one reduces the sum of both

    with model.join():                                # uneven inputs: ranks may run out of
        for x, y in my_batches:                       # batches at different steps; see join()
            ...

What construction does (every rank, same order)::

    1. plan buckets over the parameters in REVERSE order (bucket.py: 1 MiB first, 25 MiB cap)
    2. the wings' ``planned`` (observers.py ``DDP_EXTENSIONS``; before any allocation or
       message): the watch wing's pre-flight check (watch/preflight.py), one all_gather_object
       of every rank's run manifest; a difference raises PreflightError on every rank
    3. broadcast parameters and buffers from rank 0 (one message per bucket), and the float32
       master weights of a model converted by amp.MasterWeights
    4. allocate one flat buffer per bucket (process group's alloc_buffer), make every p.grad
       a view into it and reserve that view as the parameter's gradient destination (backward
       writes the gradient there, no copy), register a post-accumulate-grad hook per
       parameter (reducer.py)

A forward first broadcasts rank 0's buffers (``broadcast_buffers``, torch's default; one flat
message per dtype) when the forward before it, or the construction, was a synced forward in
grad mode: torch's rule, so the first eval forward after training (under ``no_grad``) starts
from rank 0's running statistics too. The rest of a step is the Reducer's (reducer.py);
docs/how_ddp_works.md walks through it with the scaling numbers.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import numpy as np

from minidist import comm
from minidist import tracing as trace
from minidist import xp as backend
from minidist.optim.grad_scaling import master_owner
from minidist.comm.planner import check_algorithm
from minidist.ddp.buffers import broadcast_buffer_packs, pack_buffers
from minidist.ddp.bucket import Bucket, ParamMeta, alloc_bucket_buffer, plan_buckets
from minidist.ddp.hooks import averages_plainly
from minidist.ddp.join import Join
from minidist.ddp.options import auto_overlap, check_device_ids
from minidist.ddp.passthrough import ModulePassThrough
from minidist.ddp.grad_checks import unused_param_indices
from minidist.ddp.observers import DDP_EXTENSIONS, StepStats
from minidist.ddp.reducer import Reducer
from minidist.ddp.sync_batchnorm import SyncBatchNorm
from minidist.ddp.timeline import StepTrace, follow_tracer
from minidist.logger import get_logger, rank_prefix
from minidist.tensor.grad_mode import is_grad_enabled

log = get_logger(__name__)

_MiB = 1 << 20


class DistributedDataParallel(ModulePassThrough):
    """Data-parallel wrapper: bucketed, overlapped gradient averaging (torch's API).

    The arguments up to ``static_graph`` are torch's, in torch's order, so a torch call
    ports unchanged; minidist's own options come after them and are keyword-only.

    Args:
        module: the model; every rank must build the same one (same names, shapes, dtypes).
        device_ids: torch's one-device-per-process form: None (CPU modules, or "where the
            parameters are"), or a one-element list naming the GPU that holds the parameters
            (``[local_rank]``, ``["cuda:1"]``). Anything else raises ValueError.
        output_device: None, or the same device as ``device_ids[0]``.
        dim: torch's scatter dimension for multi-device modules; unused (one device per rank).
        broadcast_buffers: broadcast rank 0's buffers (BatchNorm running statistics) to
            every rank at the start of a forward whose previous forward (or the
            construction) was a synced one in grad mode, as torch does: every training step
            starts from rank 0's statistics, and so does the first forward after training,
            an eval forward under ``no_grad`` included (one flat message per dtype; nothing
            when the model has no buffers). A forward after a ``no_grad`` or ``no_sync`` one
            sends nothing. False: each rank keeps its own buffers after the broadcast at
            construction.
        init_sync: torch's name for broadcasting rank 0's parameters and buffers at start.
        process_group: the group to reduce over (default: the world).
        bucket_cap_mb: size limit of each gradient bucket after the first (torch: 25; None
            means 25).
        find_unused_parameters: walk the autograd graph after each forward and reduce the
            parameters it does not reach as they are (zeros), so a model with branches that
            are not used every step still finishes its backward.
        check_reduction: ignored (deprecated in torch too).
        gradient_as_bucket_view: accepted; minidist's gradients are always views into the
            buckets (torch's ``True`` behaviour).
        static_graph: accepted and recorded; minidist does not specialise on it.
        broadcast_parameters: minidist's older name for ``init_sync`` (both must be True to
            broadcast).
        algorithm: all-reduce algorithm: "auto" or a name of the registry (``ALGORITHMS``).
        comm_hook: ``hook(state, bucket)`` replacing the plain averaging (see hooks.py).
        overlap: reduce buckets on a comm thread while backward runs (True), all at the end
            of backward on the main thread (False), or ``"auto"`` (default): off only when
            the node has about one core per rank (see ``auto_overlap``), or when the model
            has SyncBatchNorm layers (whose backward all-reduces; True is refused then).
        first_bucket_cap_mb: size limit of the first bucket (torch: 1).
        nonfinite_grads: after each reduction, "warn" (default), "raise" or "ignore" when an
            averaged gradient holds NaN/inf.

    Raises:
        ValueError: bad arguments, or the model has no parameter that requires grad.
        PreflightError: (a RuntimeError) the ranks' run manifests differ: another model,
            bucket plan, library version or all-reduce table on some rank (the message names
            the first differing parameter and the ranks).
    """

    def __init__(self, module: Any, device_ids: list[Any] | None = None,
                 output_device: Any = None, dim: int = 0, broadcast_buffers: bool = True,
                 init_sync: bool = True, process_group: Any = None,
                 bucket_cap_mb: float | None = 25, find_unused_parameters: bool = False,
                 check_reduction: bool = False, gradient_as_bucket_view: bool = False,
                 static_graph: bool = False, *, broadcast_parameters: bool = True,
                 algorithm: str = "auto", comm_hook: Callable | None = None,
                 overlap: bool | str = "auto", first_bucket_cap_mb: float = 1,
                 nonfinite_grads: str = "warn") -> None:
        check_device_ids(module, device_ids, output_device)
        self.device_ids, self.output_device, self.dim = device_ids, output_device, dim
        self.broadcast_buffers, self.static_graph = broadcast_buffers, static_graph
        self.gradient_as_bucket_view = gradient_as_bucket_view
        broadcast_parameters = broadcast_parameters and init_sync
        if bucket_cap_mb is None:  # torch's None: the default cap
            bucket_cap_mb = 25
        if not comm.is_initialized():  # one of several launched ranks: raise as torch does
            comm.require_group_if_launched("DistributedDataParallel(model)")
            comm.init_process_group()  # a single process: a one-rank group
        self.module = module
        self.process_group = process_group
        self.algorithm = algorithm
        self.find_unused_parameters = find_unused_parameters
        group = process_group if process_group is not None else comm.get_default_group()
        self.rank, self.world_size = group.rank, group.size
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        if not named:
            raise ValueError(f"{rank_prefix()} DistributedDataParallel: the module has no "
                             "parameter that requires grad, so there is nothing to reduce. "
                             "Wrap the model that is being trained.")
        # SyncBatchNorm all-reduces inside backward on the main thread; a comm thread reducing
        # buckets at the same time could order the two differently on different ranks.
        sync_bn = any(isinstance(m, SyncBatchNorm) for m in getattr(module, "modules", list)())
        if overlap is True and sync_bn and self.world_size > 1:
            raise ValueError(f"{rank_prefix()} DistributedDataParallel: overlap=True with "
                             "SyncBatchNorm layers in the model: their backward all-reduce would "
                             "race the comm thread's bucket reductions. Pass overlap=False or "
                             "'auto'.")
        self._names = [n for n, _ in named]
        self._params = [p for _, p in named]
        metas = [ParamMeta(n, tuple(p.array.shape), str(p.array.dtype)) for n, p in named]
        specs = plan_buckets(metas, int(bucket_cap_mb * _MiB), int(first_bucket_cap_mb * _MiB))
        self.manifest: dict | None = None  # the run manifest (the watch wing's preflight)
        for ext in DDP_EXTENSIONS:  # collective: every rank, the same extensions in order
            ext.planned(self, metas, specs, group)
        xp = backend.get_array_module(self._params[0].array)
        buffers = [alloc_bucket_buffer(group, s.numel, np.dtype(s.dtype), xp) for s in specs]
        self.buckets = [Bucket(s, self._params, self._names, b, group, algorithm,
                               is_last=s.index == len(specs) - 1)
                        for s, b in zip(specs, buffers)]
        self.bucket_algorithms = self._bucket_algorithms(group)  # what each bucket runs
        for ext in DDP_EXTENSIONS:
            ext.built(self)
        if broadcast_parameters and self.world_size > 1:
            self._broadcast_state()
        self._buffer_packs = pack_buffers(self.module) if broadcast_buffers and \
            self.world_size > 1 else []
        # torch's require_forward_param_sync: True when the last forward (or construction)
        # was a synced one in grad mode, so the next forward broadcasts rank 0's buffers
        self._buffers_stale = True
        self._join: Join | None = None  # set inside join(): uneven inputs
        for b in self.buckets:
            b.buffer[...] = 0
        if overlap == "auto":
            overlap = auto_overlap(self.world_size) and not sync_bn
        elif not isinstance(overlap, bool):
            raise ValueError(f"{rank_prefix()} DistributedDataParallel: overlap={overlap!r}; "
                             "use True, False or 'auto'.")
        self.overlap = overlap
        # One rank has nothing to wait for: a comm thread would only add a hand-off per bucket.
        self.reducer = Reducer(self._params, self._names, self.buckets,
                               overlap=overlap and self.world_size > 1,
                               find_unused_parameters=find_unused_parameters,
                               nonfinite_grads=nonfinite_grads, rank=self.rank)
        self.reducer.forward_required = True  # calling the inner model is named at backward
        self._trace: StepTrace | None = None  # the step timeline's observer, while tracing
        self._stats: StepStats | None = None  # last_step_stats' observer, once read
        if comm_hook is not None:
            self.register_comm_hook(None, comm_hook)
        trace.start_from_env(self.rank, self.world_size)  # MINIDIST_TRACE=dir: step timeline
        log.info("DDP: %d parameters (%d elements) in %d buckets %s, overlap=%s, algorithm=%s "
                 "%s", len(self._params), sum(s.numel for s in specs), len(specs),
                 [round(b.nbytes / _MiB, 2) for b in self.buckets], overlap, algorithm,
                 self.bucket_algorithms)

    # ------------------------------------------------------------------ set-up helpers

    def _bucket_algorithms(self, group: Any) -> list[str]:
        """What each bucket's all-reduce runs (the group's planner, with its calibration)."""
        try:
            check_algorithm(self.algorithm)
        except ValueError as e:  # an unknown name: the same on every rank, before any message
            raise ValueError(f"{rank_prefix()} DistributedDataParallel: {e}.") from None
        return [group.plan_all_reduce(b.buffer, self.algorithm).algorithm for b in self.buckets]

    def _broadcast_state(self, src: int = 0) -> None:
        """Rank ``src``'s parameters (packed per bucket) and buffers go to every rank."""
        for b in self.buckets:
            for p, view in zip(b.params, b.views):
                view[...] = p.array
            comm.broadcast(b.buffer, src=src, group=self.process_group)
            for p, view in zip(b.params, b.views):
                p.array[...] = view
        # float16 weights (amp.MasterWeights): the float32 masters the optimizer steps, too
        owners = {id(o): o for o in map(master_owner, self._params) if o is not None}
        for owner in owners.values():
            comm.broadcast(owner.master_buffer, src=src, group=self.process_group)
        others = [p for _, p in self.module.named_parameters() if not p.requires_grad]
        if hasattr(self.module, "named_buffers"):
            others += [t for _, t in self.module.named_buffers()]
        for t in others:
            arr = t.array if hasattr(t, "array") else t
            if arr.flags.c_contiguous:
                comm.broadcast(arr, src=src, group=self.process_group)
            else:
                tmp = backend.get_array_module(arr).ascontiguousarray(arr)
                comm.broadcast(tmp, src=src, group=self.process_group)
                arr[...] = tmp

    # ------------------------------------------------------------------ the step

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the module; with grad mode on, also prepare the reducer for the coming backward.

        With ``broadcast_buffers``, rank 0's buffers are broadcast first when the previous
        forward (or the construction) was a synced one in grad mode: torch's rule
        (``require_forward_param_sync``). Training steps therefore start from rank 0's
        statistics, the first eval forward after training too (under ``no_grad``: every rank
        must make it, as in torch), and further eval forwards or the micro-batches after a
        ``no_sync`` one send nothing. Inside ``join`` the synced forwards in grad mode
        broadcast (the steps a finished rank shadows), and nothing else does.
        """
        synced = is_grad_enabled() and self.reducer.require_sync
        sync_buffers = synced if self._join is not None else self._buffers_stale
        self._buffers_stale = synced
        if not is_grad_enabled():
            if self._buffer_packs and sync_buffers:
                broadcast_buffer_packs(self._buffer_packs, self.process_group)
            return self.module(*args, **kwargs)
        self._trace = follow_tracer(self._trace, self.reducer, self.bucket_algorithms)
        with trace.span("forward", args={"step": self.reducer.num_syncs, "sync": synced}):
            if self._join is not None and synced:
                self._join.count_active(self, 1)
            if self._buffer_packs and sync_buffers:
                broadcast_buffer_packs(self._buffer_packs, self.process_group)
            self.reducer.prepare_for_forward()
            out = self.module(*args, **kwargs)
            self.reducer.watch_output(out)
            if self.find_unused_parameters and synced:
                self.reducer.mark_unused(unused_param_indices(out, self._params,
                                                              lambda t: getattr(t, "inputs", ())))
        return out

    __call__ = forward

    @property
    def require_backward_grad_sync(self) -> bool:
        """torch's flag (nanoGPT sets it): False before a forward skips averaging, as no_sync."""
        return self.reducer.require_sync

    @require_backward_grad_sync.setter
    def require_backward_grad_sync(self, value: bool) -> None:
        self.reducer.require_sync = bool(value)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Skip gradient averaging inside the block; grads accumulate until a synced backward.

        Forward AND backward of the accumulation steps must be inside the block. The state is
        restored in ``finally``, so an exception inside leaves DDP syncing again.
        """
        old = self.reducer.require_sync
        self.reducer.require_sync = False
        try:
            yield
        finally:
            self.reducer.require_sync = old

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
        self._join = Join(divide_by_initial_world_size, self._shadow_step, self._broadcast_state)
        finished = False
        try:
            yield
            finished = True
        finally:
            join, self._join = self._join, None
            self.reducer.divisor = self.world_size
        if finished:  # an exception ends the job through the excepthook: no shadowing then
            join.shadow_until_all_joined(self)

    def _shadow_step(self, divisor: int) -> None:
        """The collectives of one synced step, contributing nothing (see ``join``): the comm
        hook on zero buckets, with the training ranks' ``divisor`` (so it makes the same calls)."""
        if self._buffer_packs:
            broadcast_buffer_packs(self._buffer_packs, self.process_group)
        for b in self.buckets:
            b.buffer[...] = 0
            b.divisor = divisor
            self.reducer.comm_hook(self.reducer.hook_state, b)

    def register_comm_hook(self, state: Any, hook: Callable) -> None:
        """Replace the averaging of each bucket by ``hook(state, bucket)`` (see hooks.py)."""
        if not callable(hook):
            raise ValueError(f"{rank_prefix()} DistributedDataParallel.register_comm_hook: hook "
                             f"{hook!r} is not callable. Pass e.g. hooks.fp16_compress_hook.")
        self.reducer.comm_hook, self.reducer.hook_state = hook, state

    @property
    def nonfinite_grad_steps(self) -> int:  # steps whose averaged grads held NaN/inf (no scaler)
        return self.reducer.nonfinite_grad_steps

    @property
    def last_step_stats(self) -> dict[str, float]:
        """Seconds of the last synced backward: ``wait_s`` (exposed comm), ``comm_s`` (busy).

        Timing is an observer of the Reducer (observers.StepStats), registered by the first
        read: that read returns zeros, every later one the step before it."""
        if self._stats is None:
            self._stats = StepStats(self.reducer.overlap)
            self.reducer.add_observer(self._stats)
        return dict(self._stats.stats)

    def close(self, release_buffers: bool = False) -> None:
        """Remove the hooks, stop the communication thread, write the step timeline if on.

        Args:
            release_buffers: also free the bucket buffers' shared-memory windows now instead of
                at process exit (for programs that build many DDP models, like the
                benchmarks). COLLECTIVE: every rank must call it. Gradients that are bucket
                views are copied out first, so ``p.grad`` stays readable.
        """
        self.reducer.close()
        tr = trace.active
        if tr is not None:  # the timeline so far is on disk even if the process is killed later
            tr.flush()
        if not release_buffers:
            return
        group = self.process_group or comm.get_default_group()
        for b in self.buckets:
            for p, view in zip(b.params, b.views):
                if p.grad is not None and p.grad.array is view:
                    p.grad = view.copy()
            buf, b.buffer, b.views = b.buffer, None, []
            group.free_buffer(buf)
        self.buckets = []

    def __repr__(self) -> str:
        return f"DistributedDataParallel(world_size={self.world_size}, buckets=" \
               f"{len(self.buckets)}, module={self.module!r})"
