"""ZeRO stage 1: each rank keeps the optimizer state of only 1/n of the parameters.

    model = DistributedDataParallel(build_model())
    opt = ZeroRedundancyOptimizer(model.parameters(), optim.AdamW, ddp=model, lr=1e-3)
    loss_fn(model(x), y).backward()     # each bucket: reduce-scatter, not all-reduce
    opt.step()                          # step my shard, then all-gather the parameters
    opt.zero_grad()

Plain DDP gives every rank the whole averaged gradient and every rank runs the same optimizer
step on every parameter, so every rank holds the whole optimizer state (AdamW: 2 floats per
parameter, plus 2 work buffers). ZeRO-1 (Rajbhandari et al., "ZeRO: Memory Optimizations
Toward Training Trillion Parameter Models", SC 2020) splits each DDP bucket's flat range into
n equal shards; rank r owns shard r::

    one bucket (flat, N elements), n = 4: 4 chunks of c = N // 4, then a tail of N - 4c < 4
    params      | chunk 0 | chunk 1 | chunk 2 | chunk 3 |t|   every rank: all of them
    grads       | chunk 0 | chunk 1 | chunk 2 | chunk 3 |t|   every rank: its own sum, local
        reduce-scatter(avg)     rank r receives the AVERAGE of chunk r only
        all-reduce(avg) of t    (< n elements: every rank keeps and steps the tail itself)
    AdamW state |  rank 0 |  rank 1 |  rank 2 |  rank 3 |t|   each rank: its chunk (+ tail)
        rank r: optimizer step on chunk r (and the tail) of the parameters
        all-gather              every rank receives every updated chunk
    params      | chunk 0 | chunk 1 | chunk 2 | chunk 3 |t|   identical on every rank again

    bytes per rank and bucket of K bytes: reduce-scatter (n-1)/n K + all-gather (n-1)/n K
    = 2 (n-1)/n K, exactly a ring all-reduce's (which IS a reduce-scatter + an all-gather)

The reduce-scatter runs in DDP's comm hook (``register_comm_hook``), so it keeps DDP's buckets,
their order and their overlap with backward; the all-gather runs at the end of ``step()``.
The parameters of a bucket are re-pointed, once, at views of one flat array per bucket
(``p.array`` is rebound at construction, never again), so the all-gather writes them in place.

The inner optimizer (``optimizer_class``) sees one flat 1-D "parameter" per bucket: its shard.
That is exact for element-wise optimizers (SGD, Adam, AdamW: every formula is per element),
not for ones that look across a tensor (LAMB, Adafactor), which are refused nowhere but would
be wrong. One parameter group only.

Without ``ddp=`` (torch's signature, ``ZeroRedundancyOptimizer(params, optimizer_class,
lr=...)``) there are no buckets to reuse: DDP all-reduces the gradients as usual and ZeRO
partitions the PARAMETERS, as torch does: sorted by size, each goes to the rank with the
fewest elements so far; rank r keeps the optimizer state of its parameters only, steps them,
and broadcasts them (one flat message per rank and dtype) so every rank holds the whole
updated model::

    params  | w1 (rank 0) | b1 (rank 1) | w2 (rank 1) | b2 (rank 0) |   (by size, greedy)
    after DDP's all-reduce: every rank has the whole averaged gradient
    rank r: inner optimizer step on its parameters only  (state: 1/n of the model)
    broadcast from each rank r: its parameters           (everyone: the updated model)

That costs a broadcast of the whole model per step on top of DDP's all-reduce (the bucket
path's reduce-scatter + all-gather cost no more than the all-reduce alone), so ``ddp=`` is
the fast path; the partition path works with several parameter groups and with any
optimizer (each parameter is stepped whole).

Invariants and limits:
- after ``backward`` only this rank's shard of the gradients is averaged: ``p.grad`` of the
  model holds the LOCAL gradient elsewhere; gradient clipping over ``model.parameters()``
  would be wrong (not supported here), and so is mixed precision's loss scaling (GradScaler).
- ``step()`` without a synced backward since the last step raises (the shards would be stale).
- DDP's NaN/inf report on reduced gradients is turned off (``nonfinite_grads="ignore"``):
  outside its chunk a rank's bucket holds local gradients, so ranks could disagree on it.
- ``state_dict()`` is COLLECTIVE (every rank calls it; the Trainer does) and returns torch's
  per-parameter layout, the same as the inner optimizer's over the whole model, so a
  checkpoint resumes at any world size, with or without ZeRO.

Parts: the shards in zero_shard.py, the path without buckets in zero_partition.py.
"""

from __future__ import annotations

from typing import Any

from minidist import comm
from minidist import xp as backend
from minidist.ddp.hooks import GradBucket
from minidist.logger import get_logger, rank_prefix
from minidist.optim import Optimizer
from minidist.optim.options import run_closure
from minidist.memory.zero_partition import Partition
from minidist.memory.zero_shard import BucketShard, GradState

log = get_logger(__name__)


class ZeroRedundancyOptimizer(Optimizer):
    """torch's ZeroRedundancyOptimizer (stage 1) over a DistributedDataParallel's buckets.

    Args:
        params: the model's parameters (the same list on every rank), or parameter groups
            (without ``ddp=`` only).
        optimizer_class: the optimizer class, e.g. ``optim.AdamW``, ``optim.SGD`` (with
            ``ddp=``: an element-wise one).
        process_group: the group to shard over (default: the DDP's, or the world).
        parameters_as_bucket_view, overlap_with_ddp: torch's options; accepted and unused
            (the ``ddp=`` path is the bucketed, overlapped one).
        ddp: the DistributedDataParallel that produces the gradients: ZeRO then reuses its
            buckets and replaces their all-reduce by a reduce-scatter (the fast path). Without
            it, parameters are partitioned between the ranks (see the module docstring).
        **defaults: passed to ``optimizer_class`` (lr, betas, weight_decay, ...).

    Raises:
        ValueError: with ``ddp``: more than one parameter group, or a parameter list that is
            not exactly the DDP model's; both paths: on every rank alike if the lists differ
            between ranks (the message names the first differing parameter and the ranks).
    """

    def __init__(self, params: Any, optimizer_class: type, process_group: Any = None,
                 parameters_as_bucket_view: bool = False, overlap_with_ddp: bool = False, *,
                 ddp: Any = None, **defaults: Any) -> None:
        name = f"{rank_prefix()} ZeroRedundancyOptimizer"
        self._partition: Partition | None = None
        self._shards: list[BucketShard] = []
        if ddp is not None and not hasattr(ddp, "register_comm_hook"):
            raise ValueError(f"{name}: ddp= must be the DistributedDataParallel model whose "
                             f"buckets it shards, got {type(ddp).__name__}.")
        if ddp is None:
            super().__init__(params, defaults)
            self.optimizer_class = optimizer_class
            self.process_group = process_group
            group = process_group or comm.get_default_group()
            self.rank, self.world_size = group.rank, group.size
            self._check_same_everywhere(name, [[f"#{i}", list(p.array.shape), str(p.array.dtype)]
                                               for i, p, _ in self.indexed_params()])
            self._partition = Partition(self, optimizer_class, defaults)
            self.optim = self._partition.optim
            self.grad_state = GradState.READY  # DDP's all-reduce: always this step's average
            self._consolidated, self._consolidated_to = None, None
            log.info("ZeRO-1 without buckets: this rank steps %d of %d parameters (%s)",
                     len(self._partition.mine), len(self._partition.owner),
                     optimizer_class.__name__)
            return
        super().__init__(params, defaults)
        if len(self.param_groups) != 1:
            raise ValueError(f"{name}: got {len(self.param_groups)} parameter groups; ZeRO here "
                             "supports one. Pass model.parameters() and per-model options.")
        self.process_group = process_group if process_group is not None else ddp.process_group
        group = self.process_group or comm.get_default_group()
        self.rank, self.world_size = group.rank, group.size
        self._check_params(ddp, name)
        self._shards = [BucketShard(b, self.rank, self.world_size) for b in ddp.buckets]
        # inner parameter 2k: bucket k's chunk of this rank, 2k+1: bucket k's tail
        self.optim = optimizer_class([part for s in self._shards for part in s.parts],
                                     **defaults)
        self.optimizer_class = optimizer_class
        self.grad_state = GradState.STALE
        self._consolidated: dict[str, Any] | None = None
        self._consolidated_to: int | None = None
        ddp.register_comm_hook(self, reduce_scatter_hook)
        # DDP checks each reduced bucket for NaN/inf and, if one is found, runs a small
        # collective to name the rank. Here each rank's bucket holds its LOCAL gradients
        # outside its chunk, so ranks could disagree on taking that path: it is turned off.
        ddp.reducer.nonfinite_grads = "ignore"
        log.info("ZeRO-1: %d buckets, this rank owns %d of %d elements (%s)", len(self._shards),
                 sum(s.chunk for s in self._shards), sum(s.numel for s in self._shards),
                 optimizer_class.__name__)

    # The base class keeps per-parameter state in ``self.state``; here it is the inner
    # optimizer's, one entry per bucket shard (this rank's part only).
    @property
    def state(self) -> dict[int, dict[str, Any]]:  # type: ignore[override]
        return self.optim.state if hasattr(self, "optim") else {}

    @state.setter
    def state(self, value: dict[int, dict[str, Any]]) -> None:
        if hasattr(self, "optim"):
            self.optim.state = value

    def _check_params(self, ddp: Any, name: str) -> None:
        """The same parameters on every rank, and exactly the DDP model's (in any order)."""
        ddp_names = {id(p): n for p, n in zip(ddp.reducer.params, ddp.reducer.names)}
        mine = [p for _, p, _ in self.indexed_params()]
        listed = [[ddp_names.get(id(p), "<not in the DDP model>"), list(p.array.shape),
                   str(p.array.dtype)] for p in mine]
        self._check_same_everywhere(name, listed)
        stray = [n for n, _, _ in listed if n == "<not in the DDP model>"]
        mine_ids = {id(p) for p in mine}
        missing = [n for p, n in zip(ddp.reducer.params, ddp.reducer.names)
                   if id(p) not in mine_ids]
        if stray or missing:
            raise ValueError(f"{name}: the parameters must be exactly the DDP model's: "
                             f"{len(stray)} are not in it, and {missing[:4]} of it are missing. "
                             "Pass model.parameters() of the DistributedDataParallel model.")

    def _check_same_everywhere(self, name: str, listed: list) -> None:
        """``listed`` (name, shape, dtype per parameter) is the same on every rank."""
        if self.world_size > 1:
            every = comm.all_gather_object(listed, group=self.process_group)
            for r, other in enumerate(every):
                if other == listed:
                    continue
                k = next((i for i, (a, b) in enumerate(zip(listed, other)) if a != b),
                         min(len(listed), len(other)))
                here = listed[k] if k < len(listed) else "nothing"
                there = other[k] if k < len(other) else "nothing"
                raise ValueError(f"{name}: the parameter lists differ between ranks: parameter "
                                 f"#{k} is {here} on rank {self.rank} but {there} on rank {r} "
                                 f"({len(listed)} vs {len(other)} parameters). Every rank must "
                                 "pass the same model.parameters().")

    # ------------------------------------------------------------------ the step

    def step(self, closure: Any = None) -> Any:
        """Step this rank's shards, then all-gather every bucket's parameters (without
        ``ddp=``: step this rank's parameters, then broadcast them from their owners).

        ``closure`` (torch's) runs first, with grad mode on; its loss is returned.

        Raises:
            RuntimeError: with ``ddp=``, no synced backward ran since the last step.
        """
        loss = run_closure(closure)
        if self._partition is not None:
            self._partition.step()
            self._consolidated, self._consolidated_to = None, None
            return loss
        if self.grad_state is not GradState.READY:
            raise RuntimeError(f"{rank_prefix()} ZeroRedundancyOptimizer.step: no synced "
                               "backward since the last step, so the gradient shards are not "
                               "this step's average. Call loss.backward() outside no_sync() "
                               "before step().")
        options = {k: v for k, v in self.param_groups[0].items() if k != "params"}
        for g in self.optim.param_groups:  # schedules write self.param_groups: pass them on
            g.update(options)
        self.optim.step()
        for s in self._shards:
            if self.world_size > 1 and s.chunk > 0:  # the tail was stepped on every rank
                s.grad_shard[...] = s.flat[s.lo:s.lo + s.chunk]  # the gradient is used up
                comm.all_gather_into(s.flat[:s.split], s.grad_shard, group=self.process_group)
        self.grad_state = GradState.STALE
        self._consolidated, self._consolidated_to = None, None
        return loss

    def comm_buffers_nbytes(self) -> int:
        """Bytes of ZeRO's own buffers: one gradient shard (1/n of a bucket) per bucket, or
        (without ``ddp=``) the flat arrays the parameters are broadcast in."""
        if self._partition is not None:
            return self._partition.nbytes()
        return sum(s.nbytes() for s in self._shards)

    # ------------------------------------------------------------------ checkpoints

    def consolidate_state_dict(self, to: int = 0) -> None:
        """Gather the whole optimizer state onto rank ``to`` (COLLECTIVE; torch's name).

        Afterwards ``state_dict()`` on rank ``to`` returns it without communicating (until the
        next ``step()``); on the other ranks it raises.
        """
        full = self._gather_state()
        self._consolidated = full if self.rank == to else None
        self._consolidated_to = to

    def state_dict(self) -> dict[str, Any]:
        """The whole state in torch's per-parameter layout (like the inner optimizer's).

        COLLECTIVE unless ``consolidate_state_dict`` ran since the last step: then only rank
        ``to`` may call it.
        """
        if self._consolidated is not None:
            return self._consolidated
        if self._consolidated_to is not None and self._consolidated_to != self.rank:
            raise RuntimeError(f"{rank_prefix()} ZeroRedundancyOptimizer.state_dict: the state "
                               f"was consolidated on rank {self._consolidated_to}; call "
                               "state_dict() there, or on every rank without "
                               "consolidate_state_dict().")
        return self._gather_state()

    def _gather_state(self) -> dict[str, Any]:
        if self._partition is not None:
            return self._partition.gather_state()
        index = {id(p): i for i, p, _ in self.indexed_params()}
        state: dict[int, dict[str, Any]] = {}
        for k, s in enumerate(self._shards):
            chunk, tail = self.optim.state.get(2 * k, {}), self.optim.state.get(2 * k + 1, {})
            full: dict[str, Any] = {}
            for key in sorted(chunk or tail):  # the same keys on every rank (same steps)
                v = (chunk or tail)[key]
                if not (hasattr(v, "shape") and getattr(v, "ndim", 0) > 0):
                    full[key] = v  # "step": the same on every rank
                    continue
                out = backend.get_array_module(s.flat).empty(s.numel, dtype=v.dtype)
                if s.chunk > 0:
                    if self.world_size > 1:
                        comm.all_gather_into(out[:s.split], chunk[key], group=self.process_group)
                    else:
                        out[:s.split] = chunk[key]
                if s.split < s.numel:
                    out[s.split:] = tail[key]
                full[key] = out
            if not full:
                continue
            for p, off in zip(s.params, s.offsets):
                n = p.array.size
                state[index[id(p)]] = {
                    key: (v[off:off + n].reshape(p.array.shape).copy() if hasattr(v, "shape")
                          else v) for key, v in full.items()}
        group = {k: v for k, v in self.param_groups[0].items() if k != "params"}
        group["params"] = list(range(len(self.param_groups[0]["params"])))
        return {"state": state, "param_groups": [group]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a whole state (from ``state_dict()`` here, or from the inner optimizer class
        over the same model); each rank keeps its shard. Every rank passes the same dict.

        Raises:
            ValueError: another number of groups or parameters, unknown keys or wrong shapes.
        """
        name = f"{rank_prefix()} ZeroRedundancyOptimizer.load_state_dict"
        if self._partition is not None:
            self._partition.load_state(name, state_dict)
            self._consolidated = None
            return
        groups = state_dict.get("param_groups", [])
        n_params = len(self.param_groups[0]["params"])
        if len(groups) != 1 or len(groups[0].get("params", [])) != n_params:
            raise ValueError(f"{name}: the checkpoint has {len(groups)} group(s) with "
                             f"{[len(g.get('params', [])) for g in groups]} parameters; this "
                             f"optimizer has 1 group of {n_params}. Build the same model.")
        by_index = {i: p for i, p, _ in self.indexed_params()}
        saved = {int(k): v for k, v in state_dict.get("state", {}).items()}
        keys = self.optim.state_keys
        for sid, s in saved.items():
            p = by_index.get(sid)
            if p is None or (keys is not None and set(s) - set(keys)):
                raise ValueError(f"{name}: state of parameter {sid} does not fit (keys "
                                 f"{sorted(s)}; {self.optimizer_class.__name__} keeps "
                                 f"{sorted(keys or [])}; {n_params} parameters).")
            for key, v in s.items():
                if hasattr(v, "shape") and getattr(v, "ndim", 0) > 0 and \
                        tuple(v.shape) != tuple(p.array.shape):
                    raise ValueError(f"{name}: state {key!r} of parameter {sid} has shape "
                                     f"{tuple(v.shape)}, the parameter {tuple(p.array.shape)}.")
        index = {id(p): i for i, p, _ in self.indexed_params()}
        new_state: dict[int, dict[str, Any]] = {}
        for k, s in enumerate(self._shards):
            entries = [(saved.get(index[id(p)]), p, off) for p, off in zip(s.params, s.offsets)]
            entries = [e for e in entries if e[0]]
            if not entries:
                continue
            xp = backend.get_array_module(s.flat)
            chunk: dict[str, Any] = {}
            tail: dict[str, Any] = {}
            for key in entries[0][0]:
                if key == "step":
                    chunk[key] = tail[key] = int(entries[0][0][key])
                    continue
                full = xp.zeros(s.numel, dtype=s.flat.dtype)
                for st, p, off in entries:
                    full[off:off + p.array.size] = xp.asarray(st[key]).reshape(-1)
                chunk[key] = full[s.lo:s.lo + s.chunk].copy()
                tail[key] = full[s.split:].copy()
            new_state[2 * k], new_state[2 * k + 1] = chunk, tail
        for key, v in groups[0].items():
            if key != "params":
                self.param_groups[0][key] = tuple(v) if isinstance(v, list) else v
        self.optim.state = new_state
        self._consolidated = None


def reduce_scatter_hook(state: ZeroRedundancyOptimizer, bucket: GradBucket) -> None:
    """DDP comm hook of ZeRO-1: rank r receives the average of its chunk of the bucket.

    Replaces the bucket's all-reduce (same bytes: the ring all-reduce's first half); the tail
    (fewer than n elements) is averaged on every rank by a small all-reduce, and the rest of
    ``bucket.buffer`` keeps this rank's local sum. The last bucket marks the shards READY.
    """
    s = state._shards[bucket.index]
    if state.world_size > 1:
        if s.chunk > 0:
            comm.reduce_scatter(s.grad_shard, bucket.buffer[:s.split], op="avg",
                                group=state.process_group)
        if s.split < s.numel:
            bucket.all_reduce(bucket.buffer[s.split:], "avg")
    if bucket.is_last:
        state.grad_state = GradState.READY


__all__ = ["ZeroRedundancyOptimizer", "GradState", "reduce_scatter_hook"]
