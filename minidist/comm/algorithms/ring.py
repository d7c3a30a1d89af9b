"""Ring all-reduce: a reduce-scatter then an all-gather around a ring (bandwidth-optimal).

The buffer (K bytes) is cut into N chunks c0..c{N-1} (sizes differ by at most one element; some
are empty when K < N). Ring, N=4; at every step rank r sends right and receives from the left:

      .--> 1 --.     right = (r+1) % N, left = (r-1) % N
     0          2    reduce-scatter, s=0..N-2: send chunk (r-s-1)%N, recv chunk (r-s-2)%N, reduce
      '-- 3 <--'     all-gather,     s=0..N-2: send chunk (r-s)%N,   recv chunk (r-s-1)%N, copy

  reduce-scatter, step 0:   c3: 0->1   c0: 1->2   c1: 2->3   c2: 3->0
                  step 1:   c2: 0->1   c3: 1->2   c0: 2->3   c1: 3->0   (partial sums travel on)
                  step 2:   c1: 0->1   c2: 1->2   c3: 2->3   c0: 3->0
  afterwards rank r owns the full reduction of chunk r (what ``reduce_scatter`` returns);
  the all-gather then passes each finished chunk once around the ring.

Cost (alpha-beta, gamma = reduce time per byte): 2(N-1) alpha + 2K(N-1)/N beta + K(N-1)/N gamma;
per rank exactly 2(N-1) messages and 2K(N-1)/N bytes, whatever N. Best for large K.
Invariant: each chunk is reduced by one rank only (in the order r-1... around the ring) and then
copied, so every rank ends with identical bits.
Receives go into a cached scratch buffer (allocated once, see scratch.py) and the reduction is an
in-place ufunc, so the hot loop allocates nothing but the slice views.
"""

from __future__ import annotations

import functools
from typing import Any

from minidist.comm.algorithms.registry import Algorithm, model
from minidist.comm.algorithms.scratch import scratch
from minidist.comm.ops import ReduceOp, combine, finalize
from minidist.comm.transports.base import Transport


@functools.lru_cache(maxsize=256)
def chunk_bounds(numel: int, n: int) -> tuple:
    """Start offsets of N near-equal chunks plus the end: chunk i is ``[b[i], b[i+1])``."""
    base, rem = divmod(numel, n)
    return tuple(i * base + min(i, rem) for i in range(n + 1))


def ring_reduce_scatter(transport: Transport, buf: Any, op: ReduceOp, tag: int = 0) -> tuple:
    """Reduce-scatter ``buf`` in place: afterwards chunk ``rank`` holds the full reduction.

    The other chunks hold partial results. Returns ``chunk_bounds(buf.size, size)``. AVG is not
    divided here (callers call ``finalize`` on what they keep).
    """
    n, r = transport.size, transport.rank
    b = chunk_bounds(buf.size, n)
    if n == 1:
        return b
    right, left = (r + 1) % n, (r - 1) % n
    incoming = scratch(transport, buf, b[1] - b[0], tag)  # chunk 0 is a largest chunk
    for s in range(n - 1):
        sc, rc = (r - s - 1) % n, (r - s - 2) % n
        mine = buf[b[rc]:b[rc + 1]]
        got = incoming[:mine.size]
        transport.sendrecv(buf[b[sc]:b[sc + 1]], right, got, left, tag)
        combine(mine, got, op)
    return b


def ring_all_gather(transport: Transport, buf: Any, tag: int = 0) -> None:
    """All-gather in place: rank r contributes chunk r of ``buf``; every rank ends with all."""
    n, r = transport.size, transport.rank
    if n == 1:
        return
    b = chunk_bounds(buf.size, n)
    right, left = (r + 1) % n, (r - 1) % n
    for s in range(n - 1):
        sc, rc = (r - s) % n, (r - s - 1) % n
        transport.sendrecv(buf[b[sc]:b[sc + 1]], right, buf[b[rc]:b[rc + 1]], left, tag)


def ring_all_reduce(transport: Transport, buf: Any, op: ReduceOp, tag: int = 0) -> None:
    """All-reduce ``buf`` (1-D, contiguous) in place with the ring; see the module docstring.

    AVG divides each chunk once, on the rank that finished it, before the all-gather passes it
    on: 1/N of the buffer per rank instead of all of it (the same bits: one division of the
    same sum)."""
    if transport.size > 1 and buf.size > 0:
        b = ring_reduce_scatter(transport, buf, op, tag)
        r = transport.rank
        finalize(buf[b[r]:b[r + 1]], op, transport.size)  # my chunk, still in cache
        ring_all_gather(transport, buf, tag)
    else:
        finalize(buf, op, transport.size)


def ring_cost(n: int, k: float, a: float, b: float, g: float) -> float:
    """Modelled time: 2(n-1) messages, 2K(n-1)/n bytes sent, K(n-1)/n reduced per rank."""
    return 2 * (n - 1) * a + 2 * k * (n - 1) / n * b + k * (n - 1) / n * g


RING = Algorithm("ring", ring_all_reduce, cost=ring_cost, constants=model(6.0, 2.5e-4))
