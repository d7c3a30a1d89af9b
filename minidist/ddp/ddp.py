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
    2. pre-flight check (preflight.py): one all_gather_object of every rank's run manifest
       (library versions, parameters, bucket plan, all-reduce table); any difference raises
       the same PreflightError on every rank, naming the field and the ranks, not a hang
    3. broadcast parameters and buffers from rank 0 (one message per bucket), and the float32
       master weights of a model converted by amp.MasterWeights
    4. allocate one flat buffer per bucket (process group's alloc_buffer), make every p.grad
       a view into it, register a post-accumulate-grad hook per parameter (reducer.py)

The rest of a step is the Reducer's: see reducer.py for the picture. docs/how_ddp_works.md
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
from minidist.ddp.preflight import allreduce_table, check_manifest, library_manifest
from minidist.ddp.reducer import Reducer, unused_param_indices
from minidist.log import get_logger, rank_prefix
from minidist.tensor.grad_mode import is_grad_enabled

log = get_logger(__name__)

_MiB = 1 << 20


class DistributedDataParallel:
    """Data-parallel wrapper: bucketed, overlapped gradient averaging (torch's API).

    Args:
        module: the model; every rank must build the same one (same names, shapes, dtypes).
        bucket_cap_mb: size limit of each gradient bucket after the first (torch: 25).
        broadcast_parameters: copy rank 0's parameters and buffers to every rank at start.
        find_unused_parameters: walk the autograd graph after each forward and reduce the
            parameters it does not reach as they are (zeros), so a model with branches that
            are not used every step still finishes its backward.
        algorithm: all-reduce algorithm: "auto", "ring", "tree", "rd", "direct", "mpi".
        comm_hook: ``hook(state, bucket)`` replacing the plain averaging (see hooks.py).
        process_group: the group to reduce over (default: the world).
        overlap: reduce buckets on a comm thread while backward runs (True), all at the end
            of backward on the main thread (False), or ``"auto"`` (default): off only when
            the node has about one core per rank (see ``auto_overlap``).
        first_bucket_cap_mb: size limit of the first bucket (torch: 1).
        nonfinite_grads: after each reduction, "warn" (default), "raise" or "ignore" when an
            averaged gradient holds NaN/inf.

    Raises:
        ValueError: bad arguments, or the model has no parameter that requires grad.
        PreflightError: (a RuntimeError) the ranks' run manifests differ: another model,
            bucket plan, library version or all-reduce table on some rank (the message names
            the first differing parameter and the ranks).
    """

    def __init__(self, module: Any, bucket_cap_mb: float = 25, broadcast_parameters: bool = True,
                 find_unused_parameters: bool = False, algorithm: str = "auto",
                 comm_hook: Callable | None = None, process_group: Any = None,
                 overlap: bool | str = "auto", first_bucket_cap_mb: float = 1,
                 nonfinite_grads: str = "warn") -> None:
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
        for b in self.buckets:
            b.buffer[...] = 0
        if overlap == "auto":
            overlap = auto_overlap(self.world_size)
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

    def _broadcast_state(self) -> None:
        """Rank 0's parameters (packed per bucket) and buffers go to every rank."""
        for b in self.buckets:
            for p, view in zip(b.params, b.views):
                view[...] = p.data
            comm.broadcast(b.buffer, src=0, group=self.process_group)
            for p, view in zip(b.params, b.views):
                p.data[...] = view
        # float16 weights (amp.MasterWeights): the float32 masters the optimizer steps, too
        owners = {id(o): o for o in map(owner_of, self._params) if o is not None}
        for owner in owners.values():
            comm.broadcast(owner.master_buffer, src=0, group=self.process_group)
        others = [p for _, p in self.module.named_parameters() if not p.requires_grad]
        if hasattr(self.module, "named_buffers"):
            others += [t for _, t in self.module.named_buffers()]
        for t in others:
            arr = t.data if hasattr(t, "data") else t
            if arr.flags.c_contiguous:
                comm.broadcast(arr, src=0, group=self.process_group)
            else:
                tmp = backend.get_array_module(arr).ascontiguousarray(arr)
                comm.broadcast(tmp, src=0, group=self.process_group)
                arr[...] = tmp

    # ------------------------------------------------------------------ the step

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the module; with grad mode on, also prepare the reducer for the coming backward."""
        if not is_grad_enabled():
            return self.module(*args, **kwargs)
        tr = trace.tracer()
        t0 = tr.now() if tr is not None else 0.0
        self.reducer.prepare_for_forward()
        out = self.module(*args, **kwargs)
        self.reducer.watch_output(out)
        if self.find_unused_parameters and self.reducer.require_sync:
            self.reducer.mark_unused(unused_param_indices(out, self._params,
                                                          lambda t: getattr(t, "_parents", ())))
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
