"""The compressing comm hooks: fewer bytes on the wire for an approximate average.

    ddp = DistributedDataParallel(model)
    ddp.register_comm_hook(None, fp16_compress_hook)                  # half the bytes on the wire
    ddp.register_comm_hook(PowerSGDState(matrix_approximation_rank=2,
                                         start_powerSGD_iter=10), powersgd_hook)

Both are comm hooks like those of hooks.py (``hook(state, bucket)``: leave the average in
``bucket.buffer``, identically on every rank); ``minidist.ddp.hooks`` and ``minidist.ddp``
export them too.

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
from typing import Any

import numpy as np

from minidist import xp as backend
from minidist.ddp.bucket import Bucket
from minidist.ddp.hooks import allreduce_hook


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


__all__ = ["PowerSGDState", "fp16_compress_hook", "powersgd_hook"]
