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

What construction does (every rank, same order)::

    1. plan buckets over the parameters in REVERSE order (bucket.py: 1 MiB first, 25 MiB cap)
    2. the wings' ``planned`` (observers.py ``DDP_EXTENSIONS``; before any allocation or
       message): the watch wing checks that every rank built the same run (PreflightError)
    3. broadcast parameters and buffers from rank 0 (one message per bucket), and the float32
       master weights of a model converted by amp.MasterWeights
    4. allocate one flat buffer per bucket (process group's alloc_buffer), make every p.grad
       a view into it and reserve that view as the parameter's gradient destination (backward
       writes the gradient there, no copy), register a post-accumulate-grad hook per
       parameter (reducer.py); then the wings' ``built`` (the watch wing labels each step's
       bucket all-reduces with the DataLoader's batch: a skipped step fails at the next)

A forward first broadcasts rank 0's buffers (see ``forward``). The rest of a step is the
Reducer's (reducer.py); docs/how_ddp_works.md walks through it with the scaling numbers.
``join()`` (uneven inputs), torch's other methods and flags, and the step statistics are the
mixin's it inherits (ddp_beyond_step.py).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import numpy as np

from minidist import comm
from minidist import tracing as trace
from minidist import xp as backend
from minidist.comm.planner import check_algorithm
from minidist.ddp.buffers import broadcast_buffer_packs, broadcast_others, pack_buffers
from minidist.ddp.bucket import Bucket, ParamMeta, alloc_bucket_buffer, plan_buckets
from minidist.ddp.options import check_device_ids, first_bucket_cap, resolve_overlap
from minidist.ddp.grad_checks import unused_param_indices
from minidist.ddp.observers import DDP_EXTENSIONS
from minidist.ddp.reducer import Reducer
from minidist.ddp.ddp_beyond_step import DDPSurface
from minidist.ddp.timeline import StepTrace, follow_tracer
from minidist.logger import get_logger, rank_prefix
from minidist.tensor.grad_mode import is_grad_enabled

log = get_logger(__name__)

_MiB = 1 << 20


class DistributedDataParallel(DDPSurface):
    """Data-parallel wrapper: bucketed, overlapped gradient averaging (torch's API).

    The arguments up to ``static_graph`` are torch's, in torch's order, so a torch call
    ports unchanged; minidist's own options come after them and are keyword-only.

    Args:
        module: the model; every rank must build the same one (same names, shapes, dtypes).
        device_ids, output_device, dim, init_sync, check_reduction, gradient_as_bucket_view,
            static_graph, broadcast_parameters: torch's; what each does here: ddp_beyond_step.py.
        broadcast_buffers: broadcast rank 0's buffers (BatchNorm running statistics) at the
            start of a forward, as torch does (see ``forward``). False: each rank keeps its
            own buffers after the broadcast at construction.
        process_group: the group to reduce over (default: the world).
        bucket_cap_mb: size limit of each gradient bucket after the first (torch: 25; None
            means 25).
        find_unused_parameters: walk the autograd graph after each forward and reduce the
            parameters it does not reach as they are (zeros), so a model with branches that
            are not used every step still finishes its backward.
        algorithm: all-reduce algorithm: "auto" or a name of the registry (``ALGORITHMS``).
        comm_hook: ``hook(state, bucket)`` replacing the plain averaging (see hooks.py).
        overlap: reduce buckets on a comm thread while backward runs (True), all at the end
            of backward on the main thread (False), or ``"auto"`` (default): off only when
            the node has about one core per rank (options.py ``auto_overlap``), or when the model
            has SyncBatchNorm layers (whose backward all-reduces; True is refused then).
        first_bucket_cap_mb: size limit of the first bucket (torch: 1) when some rank
            overlaps; without overlap, bucket_cap_mb (options.py ``first_bucket_cap``).
        nonfinite_grads: after each reduction, "warn" (default), "raise" or "ignore" when an
            averaged gradient holds NaN/inf.

    Raises:
        ValueError: bad arguments, or the model has no parameter that requires grad.
        PreflightError: (a RuntimeError, the watch wing's) the ranks built different runs:
            another model, bucket plan, library version or all-reduce table on some rank.
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
        self.overlap = resolve_overlap(overlap, module, self.world_size)  # options.py
        self._names = [n for n, _ in named]
        self._params = [p for _, p in named]
        metas = [ParamMeta(n, tuple(p.array.shape), str(p.array.dtype)) for n, p in named]
        first_mb = first_bucket_cap(first_bucket_cap_mb, bucket_cap_mb, self.overlap, group)
        specs = plan_buckets(metas, int(bucket_cap_mb * _MiB), int(first_mb * _MiB))
        self.manifest: dict | None = None  # the run manifest (the watch wing's preflight)
        for ext in DDP_EXTENSIONS:  # collective: every rank, the same extensions in order
            ext.planned(self, metas, specs, group)
        xp = backend.get_array_module(self._params[0].array)
        buffers = [alloc_bucket_buffer(group, s.numel, np.dtype(s.dtype), xp) for s in specs]
        self.buckets = [Bucket(s, self._params, self._names, b, group, algorithm,
                               is_last=s.index == len(specs) - 1)
                        for s, b in zip(specs, buffers)]
        self.bucket_algorithms = self._bucket_algorithms(group)  # what each bucket runs
        if broadcast_parameters and self.world_size > 1:
            self._broadcast_state()
        self._buffer_packs = pack_buffers(self.module) if broadcast_buffers and \
            self.world_size > 1 else []
        # torch's require_forward_param_sync: the next forward broadcasts the buffers (forward)
        self._buffers_stale = True
        self._join = None  # a join.Join inside join() (uneven inputs: ddp_beyond_step.py)
        for b in self.buckets:
            b.buffer[...] = 0
        # One rank has nothing to wait for: a comm thread would only add a hand-off per bucket.
        self.reducer = Reducer(self._params, self._names, self.buckets,
                               overlap=self.overlap and self.world_size > 1,
                               find_unused_parameters=find_unused_parameters,
                               nonfinite_grads=nonfinite_grads, rank=self.rank)
        self.reducer.forward_required = True  # calling the inner model is named at backward
        for ext in DDP_EXTENSIONS:
            ext.built(self)
        self._trace: StepTrace | None = None  # the step timeline's observer, while tracing
        self._stats = None  # last_step_stats' observer, once read (ddp_beyond_step.py)
        if comm_hook is not None:
            self.register_comm_hook(None, comm_hook)
        trace.start_from_env(self.rank, self.world_size)  # MINIDIST_TRACE=dir: step timeline
        log.info("DDP: %d parameters (%d elements) in %d buckets %s, overlap=%s, algorithm=%s "
                 "%s", len(self._params), sum(s.numel for s in specs), len(specs),
                 [round(b.nbytes / _MiB, 2) for b in self.buckets], self.overlap, algorithm,
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
        """Rank ``src``'s parameters (packed per bucket) and buffers go to every rank (and the
        frozen parameters and AMP's float32 master weights: buffers.py)."""
        for b in self.buckets:
            for p, view in zip(b.params, b.views):
                view[...] = p.array
            comm.broadcast(b.buffer, src=src, group=self.process_group)
            for p, view in zip(b.params, b.views):
                p.array[...] = view
        broadcast_others(self.module, self._params, src, self.process_group)

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

    def register_comm_hook(self, state: Any, hook: Callable) -> None:
        """Replace the averaging of each bucket by ``hook(state, bucket)`` (see hooks.py)."""
        if not callable(hook):
            raise ValueError(f"{rank_prefix()} DistributedDataParallel.register_comm_hook: hook "
                             f"{hook!r} is not callable. Pass e.g. hooks.fp16_compress_hook.")
        self.reducer.comm_hook, self.reducer.hook_state = hook, state

    def close(self, release_buffers: bool = False) -> None:
        """Remove the hooks, stop the communication thread, write the step timeline if on.
        ``release_buffers=True`` (COLLECTIVE) also frees the bucket buffers (ddp_beyond_step.py)."""
        self.reducer.close()
        tr = trace.active
        if tr is not None:  # the timeline so far is on disk even if the process is killed later
            tr.flush()
        if release_buffers:
            self._release_buffers()

    def __repr__(self) -> str:
        return f"DistributedDataParallel(world_size={self.world_size}, buckets=" \
               f"{len(self.buckets)}, module={self.module!r})"
