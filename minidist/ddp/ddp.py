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
    2. pre-flight check (preflight.py): one all_gather_object of every rank's run manifest
       (library versions, parameters, bucket plan, all-reduce table); any difference raises
       the same PreflightError on every rank, naming the field and the ranks, not a hang
    3. broadcast parameters and buffers from rank 0 (one message per bucket), and the float32
       master weights of a model converted by amp.MasterWeights
    4. allocate one flat buffer per bucket (process group's alloc_buffer), make every p.grad
       a view into it and reserve that view as the parameter's gradient destination (backward
       writes the gradient there, no copy), register a post-accumulate-grad hook per
       parameter (reducer.py)

A forward first broadcasts rank 0's buffers (``broadcast_buffers``, torch's default; one flat
message per dtype, nothing for a model without buffers) when the forward before it, or the
construction, was a synced forward in grad mode: torch's rule, so the first eval forward after
training (under ``no_grad``) starts from rank 0's running statistics too. The rest of
a step is the Reducer's: see reducer.py for the picture. docs/how_ddp_works.md
walks through it with the scaling numbers.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Iterator

import numpy as np

from minidist import comm, trace
from minidist import xp as backend
from minidist.amp import owner_of
from minidist.comm.algorithms import resolve
from minidist.ddp.bucket import Bucket, BucketSpec, ParamMeta, plan_buckets
from minidist.ddp.hooks import allreduce_hook
from minidist.ddp.preflight import allreduce_table, check_manifest, library_manifest
from minidist.ddp.reducer import Reducer, unused_param_indices
from minidist.ddp.sync_batchnorm import SyncBatchNorm
from minidist.log import get_logger, rank_prefix
from minidist.tensor.grad_mode import is_grad_enabled

log = get_logger(__name__)

_MiB = 1 << 20


def check_device_ids(module: Any, device_ids: Any, output_device: Any) -> None:
    """Raise ValueError unless ``device_ids``/``output_device`` name where the parameters are.

    torch's rule for one device per process: ``device_ids`` is None or ``[that device]``; for
    CPU modules it must be None.
    """
    devices = {backend.device_of(p.data) for p in module.parameters()}
    where = ", ".join(sorted(str(d) for d in devices)) or "nowhere (no parameters)"
    if device_ids is None:
        if output_device is not None:
            raise ValueError(f"{rank_prefix()} DistributedDataParallel: output_device="
                             f"{output_device!r} was given without device_ids. Pass both "
                             "(device_ids=[local_rank], output_device=local_rank) or neither.")
        return
    if isinstance(device_ids, (str, int, backend.device)) or len(device_ids) != 1:
        raise ValueError(f"{rank_prefix()} DistributedDataParallel: device_ids={device_ids!r}; "
                         "minidist runs one device per process, so pass a one-element list "
                         "such as [local_rank], or None.")
    wanted = backend.device(device_ids[0])
    same = devices == {wanted} or (wanted.index is None and {d.type for d in devices} == {
        wanted.type})  # "cuda" without a number: any one GPU
    if wanted.type == "cpu" or not same:
        raise ValueError(f"{rank_prefix()} DistributedDataParallel: device_ids={device_ids!r} "
                         f"but the module's parameters are on {where}. Move the model first "
                         f"(model.to({str(wanted)!r})), or pass device_ids=None for a CPU "
                         "module.")
    if output_device is not None and backend.device(output_device) != wanted:
        raise ValueError(f"{rank_prefix()} DistributedDataParallel: output_device="
                         f"{output_device!r} differs from device_ids[0]={device_ids[0]!r}. Use "
                         "the same device (or leave output_device=None).")


class DistributedDataParallel:
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
        algorithm: all-reduce algorithm: "auto", "ring", "tree", "rd", "direct", "mpi".
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
        if not comm.is_initialized():
            comm.init_process_group()
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
        metas = [ParamMeta(n, tuple(p.data.shape), str(p.data.dtype)) for n, p in named]
        specs = plan_buckets(metas, int(bucket_cap_mb * _MiB), int(first_bucket_cap_mb * _MiB))
        self.manifest = self._manifest(metas, specs, group)
        if self.world_size > 1:
            check_manifest(self.manifest, "DistributedDataParallel", self.process_group)
        xp = backend.get_array_module(self._params[0].data)
        self.buckets = [Bucket(s, self._params, self._names,
                               self._alloc(s.numel, np.dtype(s.dtype), xp)) for s in specs]
        algorithms = self._bucket_algorithms(group)
        if broadcast_parameters and self.world_size > 1:
            self._broadcast_state()
        self._buffer_packs = self._pack_buffers() if broadcast_buffers and \
            self.world_size > 1 else []
        # torch's require_forward_param_sync: True when the last forward (or construction)
        # was a synced one in grad mode, so the next forward broadcasts rank 0's buffers
        self._buffers_stale = True
        self._join: _Join | None = None  # set inside join(): uneven inputs
        for b in self.buckets:
            b.buffer[...] = 0
        if overlap == "auto":
            overlap = auto_overlap(self.world_size) and not sync_bn
        elif not isinstance(overlap, bool):
            raise ValueError(f"{rank_prefix()} DistributedDataParallel: overlap={overlap!r}; "
                             "use True, False or 'auto'.")
        self.overlap = overlap
        # One rank has nothing to wait for: a comm thread would only add a hand-off per bucket.
        self.reducer = Reducer(self._params, self._names, self.buckets, self._all_reduce,
                               self.world_size, overlap=overlap and self.world_size > 1,
                               find_unused_parameters=find_unused_parameters,
                               nonfinite_grads=nonfinite_grads, rank=self.rank)
        self.reducer.bucket_algorithms = algorithms
        if comm_hook is not None:
            self.register_comm_hook(None, comm_hook)
        trace.start_from_env(self.rank, self.world_size)  # MINIDIST_TRACE=dir: step timeline
        log.info("DDP: %d parameters (%d elements) in %d buckets %s, overlap=%s, algorithm=%s "
                 "%s", len(self._params), sum(s.numel for s in specs), len(specs),
                 [round(b.nbytes / _MiB, 2) for b in self.buckets], overlap, algorithm,
                 self.reducer.bucket_algorithms)

    # ------------------------------------------------------------------ set-up helpers

    def _all_reduce(self, array: Any, op: str) -> None:
        tr = trace.tracer()
        if tr is None:
            comm.all_reduce(array, op=op, algorithm=self.algorithm, group=self.process_group)
            return
        t0 = tr.now()
        comm.all_reduce(array, op=op, algorithm=self.algorithm, group=self.process_group)
        self._trace_all_reduce(tr, array, op, t0, tr.now())

    def _trace_all_reduce(self, tr: trace.Tracer, array: Any, op: str, t0: float, t1: float
                          ) -> None:
        """One all-reduce on the communication lane: bytes, algorithm, bus bandwidth.

        busbw = 2(n-1)/n x bytes / time: what each rank's link carried per second by the
        bandwidth-optimal (ring) schedule, comparable across world sizes (nccl-tests' busbw).
        """
        n = self.world_size
        index = next((b.index for b in self.buckets if b.buffer is array), None)
        if index is not None:
            name, algo = f"all_reduce bucket {index}", self.reducer.bucket_algorithms[index]
        else:  # a comm hook's own array (fp16 copy, PowerSGD factors)
            group = self.process_group or comm.get_default_group()
            name, algo = "all_reduce", resolve(self.algorithm, group.transport, array)[0]
        busbw = 2 * (n - 1) / n * array.nbytes / max(t1 - t0, 1e-9) / 1e9 if n > 1 else 0.0
        args = {"step": self.reducer.num_syncs, "bytes": int(array.nbytes), "algorithm": algo,
                "op": op, "busbw_GBps": round(busbw, 3)}
        if index is not None:
            args["bucket"] = index
        tr.complete(name, t0, t1, lane=trace.COMM, cat="allreduce", args=args)

    def _alloc(self, numel: int, dtype: Any, xp: Any) -> Any:
        group = self.process_group or comm.get_default_group()
        buf = group.alloc_buffer(numel, dtype, xp)
        if backend.get_array_module(buf) is not xp:  # device params, host-only transport
            buf = xp.empty(numel, dtype=dtype)
        return buf

    def _manifest(self, metas: list[ParamMeta], specs: list[BucketSpec], group: Any
                  ) -> dict[str, Any]:
        """This rank's run manifest (preflight.py): what every rank must agree on.

        The Trainer extends it (dataset, batches per epoch, ...) for its own check at ``fit``.
        """
        return {**library_manifest(self.world_size),
                "parameter": [[m.name, list(m.shape), m.dtype] for m in metas],
                "bucket": [[s.dtype, list(s.param_indices), s.numel] for s in specs],
                "all-reduce": allreduce_table(self.algorithm, group)}

    def _bucket_algorithms(self, group: Any) -> list[str]:
        """The algorithm each bucket's all-reduce runs (what "auto" resolves to), for traces."""
        try:
            return [resolve(self.algorithm, group.transport, b.buffer)[0] for b in self.buckets]
        except ValueError as e:  # an unknown name: the same on every rank, before any message
            raise ValueError(f"{rank_prefix()} DistributedDataParallel: {e}.") from None

    def _broadcast_state(self, src: int = 0) -> None:
        """Rank ``src``'s parameters (packed per bucket) and buffers go to every rank."""
        for b in self.buckets:
            for p, view in zip(b.params, b.views):
                view[...] = p.data
            comm.broadcast(b.buffer, src=src, group=self.process_group)
            for p, view in zip(b.params, b.views):
                p.data[...] = view
        # float16 weights (amp.MasterWeights): the float32 masters the optimizer steps, too
        owners = {id(o): o for o in map(owner_of, self._params) if o is not None}
        for owner in owners.values():
            comm.broadcast(owner.master_buffer, src=src, group=self.process_group)
        others = [p for _, p in self.module.named_parameters() if not p.requires_grad]
        if hasattr(self.module, "named_buffers"):
            others += [t for _, t in self.module.named_buffers()]
        for t in others:
            arr = t.data if hasattr(t, "data") else t
            if arr.flags.c_contiguous:
                comm.broadcast(arr, src=src, group=self.process_group)
            else:
                tmp = backend.get_array_module(arr).ascontiguousarray(arr)
                comm.broadcast(tmp, src=src, group=self.process_group)
                arr[...] = tmp

    def _pack_buffers(self) -> list[tuple[Any, list[Any]]]:
        """Group the module's buffers by dtype, each group with a cached flat array.

        Returns ``[(flat, [buffer arrays])]``: ``_sync_buffers`` copies the buffers into
        ``flat``, broadcasts it once, and copies back, so a BatchNorm model pays one message
        per dtype per step (float32 statistics + int64 counters: two), not one per buffer.
        """
        arrays = [t.data for _, t in self.module.named_buffers()] \
            if hasattr(self.module, "named_buffers") else []
        by_dtype: dict[Any, list[Any]] = {}
        for arr in arrays:
            by_dtype.setdefault((arr.dtype, backend.get_array_module(arr)), []).append(arr)
        return [(xp.empty(sum(a.size for a in group), dtype=dtype), group)
                for (dtype, xp), group in by_dtype.items()]

    def _sync_buffers(self) -> None:
        """Rank 0's buffers to every rank: one broadcast per dtype (COLLECTIVE)."""
        for flat, arrays in self._buffer_packs:
            at = 0
            for a in arrays:
                flat[at:at + a.size] = a.reshape(-1)
                at += a.size
            comm.broadcast(flat, src=0, group=self.process_group)
            at = 0
            for a in arrays:
                a[...] = flat[at:at + a.size].reshape(a.shape)
                at += a.size

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
                self._sync_buffers()
            return self.module(*args, **kwargs)
        tr = trace.tracer()
        t0 = tr.now() if tr is not None else 0.0
        if self._join is not None and self.reducer.require_sync:
            self._join.count_active(self, 1)
        if self._buffer_packs and sync_buffers:
            self._sync_buffers()
        self.reducer.prepare_for_forward()
        out = self.module(*args, **kwargs)
        self.reducer.watch_output(out)
        if self.find_unused_parameters and self.reducer.require_sync:
            self.reducer.mark_unused(unused_param_indices(out, self._params,
                                                          lambda t: getattr(t, "inputs", ())))
        if tr is not None:
            tr.complete("forward", t0, tr.now(), args={"step": self.reducer.num_syncs,
                                                       "sync": self.reducer.require_sync})
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

    @contextlib.contextmanager
    def join(self, divide_by_initial_world_size: bool = False, enable: bool = True,
             throw_on_early_termination: bool = False) -> Iterator[None]:
        """Train on uneven inputs: ranks may run out of batches at different steps.

        Inside the block every synced forward first all-reduces a count of the ranks still
        training (one 8-byte message; without ``join`` nothing is sent). A rank that leaves
        the block keeps answering its peers' collectives with zeros until the count is 0::

            step   rank 0 (3 batches)      rank 1 (4)          rank 2 (5)
            0..2   count=3, train          count=3, train      count=3, train
            3      [exit] count 0, shadow  count=2, train      count=2, train
            4      count 0, shadow         [exit] shadow       count=1, train
            5      count 0 -> done         count 0 -> done     [exit] count 0 -> done
                   then rank 2 (the last to leave) broadcasts its parameters and buffers

        Shadowing a step = the buffer broadcast (``broadcast_buffers``) and every bucket's
        all-reduce with a zero bucket, in the order the training ranks run them, so nobody
        hangs. The summed gradients are divided by the number of ranks that trained this step,
        so each step's gradient is the exact average over the real batches.

        Args:
            divide_by_initial_world_size: divide by the world size instead (torch's default
                is True; minidist's is False: the exact average over the real batches).
            enable: False turns the block into a no-op (torch's flag).
            throw_on_early_termination: not supported (ValueError if True).

        Raises:
            ValueError: ``throw_on_early_termination=True``, or a comm hook is registered
                (the shadow step runs the plain all-reduce only).

        The optimizer state (momentum, Adam moments) of a rank that left early is not
        updated by the steps it shadowed; the parameters are (the final broadcast).
        """
        if throw_on_early_termination:
            raise ValueError(f"{rank_prefix()} DistributedDataParallel.join: "
                             "throw_on_early_termination=True is not supported; use the "
                             "default (ranks that run out of batches shadow the others).")
        if self.reducer.comm_hook is not allreduce_hook:
            raise ValueError(f"{rank_prefix()} DistributedDataParallel.join: a comm hook "
                             f"({getattr(self.reducer.comm_hook, '__name__', '?')}) is "
                             "registered; join shadows the plain all-reduce only. Remove the "
                             "hook for training on uneven inputs.")
        if not enable or self.world_size == 1:
            yield
            return
        self._join = _Join(divide_by_initial_world_size)
        finished = False
        try:
            yield
            finished = True
        finally:
            join, self._join = self._join, None
            self.reducer.divisor = self.world_size
        if finished:  # an exception ends the job through the excepthook: no shadowing then
            join.shadow_until_all_joined(self)

    def _shadow_step(self) -> None:
        """The collectives of one synced step, contributing nothing (see ``join``)."""
        if self._buffer_packs:
            self._sync_buffers()
        for b in self.buckets:
            b.buffer[...] = 0
            with comm.ledger_label(f"bucket={b.index}"):
                self._all_reduce(b.buffer, "sum")

    def register_comm_hook(self, state: Any, hook: Callable) -> None:
        """Replace the averaging of each bucket by ``hook(state, bucket)`` (see hooks.py)."""
        if not callable(hook):
            raise ValueError(f"{rank_prefix()} DistributedDataParallel.register_comm_hook: hook "
                             f"{hook!r} is not callable. Pass e.g. hooks.fp16_compress_hook.")
        self.reducer.comm_hook, self.reducer.hook_state = hook, state

    # ------------------------------------------------------------------ module pass-through

    def parameters(self) -> Iterator[Any]:
        """The wrapped module's parameters (the same objects)."""
        return iter(self.module.parameters())

    def named_parameters(self) -> Iterator[tuple[str, Any]]:
        """The wrapped module's named parameters, without a ``module.`` prefix."""
        return iter(self.module.named_parameters())

    def state_dict(self) -> dict[str, Any]:
        """The bare module's state dict (torch keys, no ``module.`` prefix)."""
        return self.module.state_dict()

    def load_state_dict(self, state_dict: Any, strict: bool = True) -> Any:
        """Load into the bare module (keys without a ``module.`` prefix)."""
        return self.module.load_state_dict(state_dict, strict=strict)

    def train(self, mode: bool = True) -> DistributedDataParallel:
        self.module.train(mode)
        return self

    def eval(self) -> DistributedDataParallel:
        self.module.eval()
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the gradients (None grads become bucket views again when backward reaches them)."""
        self.module.zero_grad(set_to_none=set_to_none)

    @property
    def nonfinite_grad_steps(self) -> int:
        """Synced steps whose averaged gradients held NaN/inf (without a GradScaler)."""
        return self.reducer.nonfinite_grad_steps

    @property
    def last_step_stats(self) -> dict[str, float]:
        """Seconds of the last synced backward: ``wait_s`` (exposed comm), ``comm_s`` (busy)."""
        return dict(self.reducer.stats)

    def close(self, release_buffers: bool = False) -> None:
        """Remove the hooks, stop the communication thread, write the step timeline if on.

        Args:
            release_buffers: also free the bucket buffers' shared-memory windows now instead of
                at process exit (for programs that build many DDP models, like the
                benchmarks). COLLECTIVE: every rank must call it. Gradients that are bucket
                views are copied out first, so ``p.grad`` stays readable.
        """
        self.reducer.close()
        tr = trace.tracer()
        if tr is not None:  # the timeline so far is on disk even if the process is killed later
            tr.flush()
        if not release_buffers:
            return
        group = self.process_group or comm.get_default_group()
        for b in self.buckets:
            for p, view in zip(b.params, b.views):
                if p.grad is view:
                    p.grad = view.copy()
            buf, b.buffer, b.views = b.buffer, None, []
            group.free_buffer(buf)
        self.buckets = []

    def __repr__(self) -> str:
        return f"DistributedDataParallel(world_size={self.world_size}, buckets=" \
               f"{len(self.buckets)}, module={self.module!r})"


class _Join:
    """The bookkeeping of one ``DistributedDataParallel.join()`` block."""

    def __init__(self, divide_by_initial_world_size: bool) -> None:
        self.divide_by_initial_world_size = divide_by_initial_world_size
        self.steps = 0  # synced forwards this rank trained inside the block
        self.count = np.zeros(1, dtype=np.int64)

    def count_active(self, ddp: DistributedDataParallel, mine: int) -> int:
        """All-reduce how many ranks still train (``mine``: 1 training, 0 shadowing)."""
        self.count[0] = mine
        comm.all_reduce(self.count, op="sum", group=ddp.process_group)
        active = int(self.count[0])
        if mine:
            self.steps += 1
            ddp.reducer.divisor = ddp.world_size if self.divide_by_initial_world_size \
                else active
        return active

    def shadow_until_all_joined(self, ddp: DistributedDataParallel) -> None:
        """Shadow the others' steps until none trains; then the last to leave broadcasts."""
        shadowed = 0
        while self.count_active(ddp, 0) > 0:
            ddp._shadow_step()
            shadowed += 1
        counts = comm.all_gather_object(self.steps, group=ddp.process_group)
        src = counts.index(max(counts))  # a rank that trained every step holds the final model
        ddp._broadcast_state(src)
        if shadowed:
            log.info("join: trained %d steps, shadowed %d; final model from rank %d",
                     self.steps, shadowed, src)


_LOCAL_SIZE_VARS = ("LOCAL_WORLD_SIZE", "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE")


def auto_overlap(world_size: int, cpus: int | None = None, env: Any = None) -> bool:
    """What ``overlap="auto"`` picks, from where the communication time goes (measured on a
    2-vCPU VM, docs/how_ddp_works.md)::

        ranks on this node x 2 <= cores  ->  True:  the comm thread gets a core of its own, so
                                             the all-reduce runs beside backward
        ranks on this node > cores       ->  True:  oversubscribed; most of the "comm" time is
                                             waiting for descheduled peers, and a comm thread
                                             lets backward go on meanwhile (n=4 on 2 vCPUs:
                                             1-10% faster in every run)
        otherwise (about a core a rank)  ->  False: the shared-memory all-reduce is CPU work
                                             (adds, copies) that can only time-slice with
                                             backward on the same core; the thread adds
                                             hand-offs and GIL switches (n=2 on 2 vCPUs: on
                                             vs off within noise, off ahead in most runs)

    Ranks on this node: ``LOCAL_WORLD_SIZE`` (torchrun), ``MPI_LOCALNRANKS`` (MPICH),
    ``OMPI_COMM_WORLD_LOCAL_SIZE`` (Open MPI), else ``world_size`` (one node assumed).
    """
    if world_size <= 1:
        return False
    env = os.environ if env is None else env
    local = next((int(env[v]) for v in _LOCAL_SIZE_VARS if str(env.get(v, "")).isdigit()),
                 world_size)
    local = max(local, 1)
    cpus = cpus if cpus is not None else (os.cpu_count() or 1)
    return 2 * local <= cpus or local > cpus
