"""Communication hooks: how a ready gradient bucket is turned into the average across ranks.

    ddp = DistributedDataParallel(model)
    ddp.register_comm_hook(None, fp16_compress_hook)                  # half the bytes on the wire
    ddp.register_comm_hook(PowerSGDState(matrix_approximation_rank=2,
                                         start_powerSGD_iter=10), powersgd_hook)

A hook is ``hook(state, bucket) -> None``: it must leave ``bucket.buffer`` holding the
AVERAGE over ranks of what every rank had there, identically on every rank. ``bucket`` is the
DDP's ``Bucket`` (bucket.py: ``buffer``, ``index``, ``views``, ``names``, ``world_size``,
``divisor``, ``is_last``); ``bucket.all_reduce(array, op)`` reduces over the DDP's process
group with its algorithm. torch hooks return a Future; ours run synchronously, on DDP's
communication thread when overlap is on, which gives the same overlap without futures. A
hook that needs to act at other moments of the step carries a Reducer observer class as its
``observer`` attribute (observers.py); the Reducer registers one while the hook is in use.

Hooks here:
- ``avg_allreduce_hook``: DDP's default. The average is one all-reduce with op AVG: the
  algorithm sums and divides by n (the shared-memory one divides each piece of the sum while
  it is in cache, so the division costs no pass over the bucket).
- ``allreduce_hook``: the textbook average (torch's default hook): divide by n, all-reduce
  the sum. ``DistributedDataParallel(model, comm_hook=allreduce_hook)``.
- ``prescaled_allreduce_hook``: the same average with the division folded into backward (a
  named fast path, see its docstring; ``FoldedAverage`` below it, the Reducer observer it
  brings, is its side of the step). The three are timed side by side by
  ``benchmarks/ddp_scaling.py --hooks 300`` (docs/how_ddp_works.md).
- ``fp16_compress_hook``: divide by the world size, cast to float16, all-reduce the sum, cast
  back. Dividing first (as torch's ``fp16_compress_hook``) keeps the float16 sum from
  overflowing (max 65504) at large world sizes.
- ``powersgd_hook``: rank-r compression with error feedback (Vogels et al., NeurIPS 2019,
  "PowerSGD: Practical Low-Rank Gradient Compression for Distributed Optimization")::

      per matrix-shaped gradient G (n x m), with local error memory E and warm-started Q (m x r):
      M = G + E                  error feedback: what was lost last time is sent now
      P = M Q                    n x r    all-reduce(P, sum)      <- n*r numbers, not n*m
      P = orthonormalize(P)      Gram-Schmidt on the columns (same bits on every rank)
      Q = M^T P                  m x r    all-reduce(Q, avg)      <- m*r numbers
      G~ = P Q^T                 the same on every rank; E = M - G~ (local)

  1-D parameters (biases) and tiny matrices go uncompressed in one all-reduce per bucket.

Both compose with loss scaling (minidist.amp.GradScaler): they average the SCALED gradients,
and the scaler unscales the bucket after the hook. A float16 cast can overflow to inf; that
is a normal event under loss scaling (the step is skipped and the scale backs off). PowerSGD
keeps its error memory and Q only from steps whose reduced P and Q are finite (the same on
every rank), so one overflowing step does not poison every later one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from minidist import xp as backend
from minidist.ddp.bucket import Bucket
from minidist.ddp.observers import ReducerObserver

GradBucket = Bucket  # torch's name for what a hook receives: the one bucket class


def allreduce_hook(state: Any, bucket: Bucket) -> None:
    """The textbook hook: the average of the bucket over the ranks.

    Each rank divides its gradients by n, then one all-reduce SUM adds them up: the sum of
    grad / n is the average (torch's ``allreduce_hook`` divides first too). n is
    ``bucket.divisor``: the world size, or under ``DistributedDataParallel.join()`` the number
    of ranks that trained this step.
    """
    if bucket.world_size > 1:  # the average over one rank is the bucket itself
        bucket.buffer /= bucket.divisor
        bucket.all_reduce(bucket.buffer, "sum")


def avg_allreduce_hook(state: Any, bucket: Bucket) -> None:
    """DDP's default hook: the average of the bucket over the ranks, one all-reduce AVG.

    AVG is the sum over the ranks divided by n, and the algorithm divides where it already
    holds the data: the shared-memory all-reduce divides each piece of its slice while the
    piece is in cache, before pushing it to the peers. Three cases go the textbook way
    (``allreduce_hook``: divide, then sum): one rank; ``DistributedDataParallel.join()``,
    where ``bucket.divisor`` (the ranks that trained) is not the world size; and float16
    buckets, where dividing first keeps the sum from overflowing.
    """
    if bucket.world_size == bucket.divisor > 1 and bucket.buffer.dtype.itemsize >= 4:
        bucket.all_reduce(bucket.buffer, "avg")
    else:
        allreduce_hook(state, bucket)


def prescaled_allreduce_hook(state: Any, bucket: Bucket) -> None:
    """An opt-in fast path: the average, with the division by n folded into backward.

    A named fast path beside ``allreduce_hook``. It brings its Reducer observer
    (``FoldedAverage`` below), which reserves each gradient's bucket slot with
    ``scale = 1/n`` (``minidist.tensor.GradDestination``) for a synced step: backward writes
    ``grad / n`` where it writes the gradient anyway (linear's weight gradient: the GEMM's
    64-row operand is scaled), so the all-reduce SUM is the average and no pass over the
    bucket divides it. Compare it with the default: ``benchmarks/ddp_scaling.py --hooks 300``.
    """
    if bucket.world_size > 1:
        bucket.all_reduce(bucket.buffer, "sum")


class FoldedAverage(ReducerObserver):
    """The Reducer's side of ``prescaled_allreduce_hook``: the per-step scales of the
    gradient destinations. The hook brings it (its ``observer`` attribute): the Reducer
    registers it while the hook is the comm hook, like any observer::

        step_start(reducer)     a synced step: empty slots get scale 1/n; a slot that already
                                holds a gradient (no_sync accumulation,
                                zero_grad(set_to_none=False)) keeps scale 1. Any other step
                                (no_sync): every slot scale 1, nothing is averaged
        bucket_ready(bucket)    its gradients are complete: a slot written with scale 1 is
                                divided now (once), and every scale goes back to 1, so that a
                                later backward outside a synced step is not averaged

    (A backward that raised keeps its scales until the next forward through DDP.)
    """

    def __init__(self) -> None:
        self.divisor = 1

    def step_start(self, reducer: Any) -> None:
        self.divisor = reducer.divisor if reducer.require_sync else 1
        for b in reducer.buckets:
            folds = self.divisor > 1 and b.buffer.dtype.kind == "f"
            for p in b.params:
                p.grad_destination.scale = 1.0 / self.divisor if folds and p.grad is None else 1.0

    def bucket_ready(self, bucket: Any) -> None:
        for p, view in zip(bucket.params, bucket.views):
            dest = p.grad_destination
            if dest.scale == 1.0 and self.divisor > 1 and view.dtype.kind == "f":
                view /= view.dtype.type(self.divisor)  # written whole: divide it now
            dest.scale = 1.0


prescaled_allreduce_hook.observer = FoldedAverage  # type: ignore[attr-defined]


def averages_plainly(hook: Callable[..., Any]) -> bool:
    """True for the hooks that compute the plain average with one all-reduce per bucket (the
    default, the textbook one and the prescaled fast path): what ``join()`` can shadow with
    zeros."""
    return hook in (avg_allreduce_hook, allreduce_hook, prescaled_allreduce_hook)


def fp16_compress_hook(state: Any, bucket: Bucket) -> None:
    """Average the bucket in float16: half the bytes on the wire, ~3 decimal digits kept."""
    xp = backend.get_array_module(bucket.buffer)
    with np.errstate(over="ignore"):  # overflow -> inf, caught after the reduction
        half = (bucket.buffer / bucket.world_size).astype(xp.float16)
    bucket.all_reduce(half, "sum")
    bucket.buffer[...] = half


@dataclass
class PowerSGDState:
    """Settings and per-parameter memory of :func:`powersgd_hook` (torch's argument names).

    Args:
        process_group: unused here (the hook uses the DDP's group); kept for torch parity.
        matrix_approximation_rank: r, the rank of the approximation (1-4 is typical).
        start_powerSGD_iter: plain all-reduce for this many steps first (compression is harmful
            in the first, fast-moving steps; torch default 1000).
        min_compression_rate: compress a matrix only if (n*m) / ((n+m)*r) exceeds this.
        use_error_feedback: keep what compression lost and add it to the next gradient.
        warm_start: reuse last step's Q instead of a fresh random one (better, cheaper).
        random_seed: seed of the initial Q, the same on every rank.
    """

    process_group: Any = None
    matrix_approximation_rank: int = 1
    start_powerSGD_iter: int = 1_000
    min_compression_rate: float = 2.0
    use_error_feedback: bool = True
    warm_start: bool = True
    random_seed: int = 0
    iter: int = 0
    errors: dict = field(default_factory=dict)   # (bucket, slot) -> error memory E
    qs: dict = field(default_factory=dict)       # (bucket, slot) -> Q (m x r)

    def __post_init__(self) -> None:
        if self.matrix_approximation_rank < 1:
            raise ValueError(f"PowerSGDState: matrix_approximation_rank="
                             f"{self.matrix_approximation_rank}; it must be >= 1.")


def _orthonormalize(p: Any) -> None:
    """Gram-Schmidt on the columns of ``p`` in place (deterministic: same bits on every rank).

    A column that is (numerically) in the span of the previous ones becomes ZERO instead of a
    normalized rounding error: a rank-deficient P (fewer samples than r) then still gives an
    exact projection P P^T, and the zero column contributes nothing.
    """
    xp = backend.get_array_module(p)
    rel_tol = 1e-4 if p.dtype == xp.float32 else 1e-10
    for i in range(p.shape[1]):
        col = p[:, i]
        before = float(xp.sqrt(col @ col))
        for j in range(i):
            col -= (p[:, j] @ col) * p[:, j]
        norm = float(xp.sqrt(col @ col))
        if norm <= rel_tol * before or norm == 0.0:
            col[...] = 0
        else:
            col /= norm


def _initial_q(state: PowerSGDState, key: tuple, shape: tuple, dtype: Any, xp: Any) -> Any:
    """A random orthonormal Q, the same on every rank (seeded by bucket, slot and step)."""
    rng = np.random.default_rng([state.random_seed, key[0], key[1], state.iter])
    q = xp.asarray(rng.standard_normal(shape).astype(dtype))
    _orthonormalize(q)
    return q


def powersgd_hook(state: PowerSGDState, bucket: Bucket) -> None:
    """Average the bucket with PowerSGD low-rank compression (see the module docstring)."""
    try:
        if state.iter < state.start_powerSGD_iter:
            allreduce_hook(state, bucket)
        else:
            _powersgd(state, bucket)
    finally:
        if bucket.is_last:  # one step = one pass over every bucket
            state.iter += 1


def _powersgd(state: PowerSGDState, bucket: Bucket) -> None:
    xp = backend.get_array_module(bucket.buffer)
    r = state.matrix_approximation_rank
    mats, plain = [], []
    for k, v in enumerate(bucket.views):
        if v.ndim >= 2:
            n, m = v.shape[0], int(np.prod(v.shape[1:]))
            rank = min(n, m, r)
            if n * m > (n + m) * rank * state.min_compression_rate:
                mats.append((k, v.reshape(n, m), rank))
                continue
        plain.append(k)
    # Uncompressed part: biases and small matrices, packed into one message.
    if plain:
        packed = xp.concatenate([bucket.views[k].reshape(-1) for k in plain])
        bucket.all_reduce(packed, "avg")
        off = 0
        for k in plain:
            v = bucket.views[k]
            v.reshape(-1)[...] = packed[off:off + v.size]
            off += v.size
    if not mats:
        return
    # M = G + E; P = M Q for every matrix, all P in one message.
    ms = []
    for k, g, rank in mats:
        key = (bucket.index, k)
        m_ = g.copy()
        if state.use_error_feedback:
            if key not in state.errors:
                state.errors[key] = xp.zeros_like(m_)
            m_ += state.errors[key]
        q = state.qs.get(key)
        if q is None or not state.warm_start or not bool(xp.all((q * q).sum(axis=0) > 0)):
            # fresh start, or a column died (rank-deficient last step): draw Q anew
            state.qs[key] = _initial_q(state, key, (g.shape[1], rank), g.dtype, xp)
        ms.append(m_)
    ps = [m_ @ state.qs[(bucket.index, k)] for m_, (k, _, _) in zip(ms, mats)]
    flat_p = xp.concatenate([p.reshape(-1) for p in ps])
    bucket.all_reduce(flat_p, "sum")
    off = 0
    for i, p in enumerate(ps):
        ps[i] = flat_p[off:off + p.size].reshape(p.shape)
        off += p.size
        _orthonormalize(ps[i])
    qs = [m_.T @ p for m_, p in zip(ms, ps)]
    flat_q = xp.concatenate([q.reshape(-1) for q in qs])
    bucket.all_reduce(flat_q, "avg")
    # P and Q are identical on every rank after their all-reduces: so is this verdict. A
    # non-finite step (an overflow under loss scaling) keeps the previous error memory and Q.
    keep = bool(xp.isfinite(flat_p).all()) and bool(xp.isfinite(flat_q).all())
    off = 0
    for (k, g, _), m_, p, q in zip(mats, ms, ps, qs):
        q = flat_q[off:off + q.size].reshape(q.shape)
        off += q.size
        approx = p @ q.T
        g[...] = approx
        if not keep:
            continue
        if state.use_error_feedback:
            state.errors[(bucket.index, k)] = m_ - approx
        state.qs[(bucket.index, k)] = q.copy()
