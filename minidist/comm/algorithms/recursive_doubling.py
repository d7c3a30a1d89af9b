"""Recursive doubling (small messages); recursive halving/doubling, Rabenseifner (large).

Recursive doubling, p=4 (p a power of two): in step k each rank swaps its WHOLE buffer with the
partner whose rank differs in bit k, and both reduce:

  step 0:  0<->1   2<->3        afterwards 0,1 hold x0+x1 and 2,3 hold x2+x3
  step 1:  0<->2   1<->3        afterwards everyone holds (x0+x1)+(x2+x3)

Rabenseifner (K >= HALVING_MIN_BYTES, rabenseifner.py): reduce-scatter by recursive HALVING,
then all-gather by recursive DOUBLING with the same partners (fewer bytes per rank).

Non-power-of-two N: with p = 2^floor(log2 N) and rem = N - p, the first 2*rem ranks fold in
pairs before (even rank r sends its buffer to r+1, which reduces) and unfold after (r+1 sends
the result back); the p remaining ranks run the algorithm above with virtual ranks.

Cost (fold adds 2 alpha + 2K beta + K gamma when N is not a power of two):
  doubling      log2(p) (alpha + K beta + K gamma)
  Rabenseifner  2 log2(p) alpha + 2K(p-1)/p beta + K(p-1)/p gamma
Invariant: in doubling both partners compute X+Y and Y+X, equal bit for bit because IEEE
addition (and max/min/multiply) is commutative, so all ranks agree by induction; in
Rabenseifner each element is reduced by one rank and then copied.
"""

from __future__ import annotations

import math
from typing import Any

from minidist.comm.algorithms.rabenseifner import (HALVING_MIN_BYTES,  # noqa: F401
                                                   halving_doubling, uses_halving)
from minidist.comm.algorithms.registry import Algorithm, model
from minidist.comm.algorithms.scratch import scratch
from minidist.comm.ops import ReduceOp, combine, finalize
from minidist.comm.transports.base import Transport


def _doubling(transport: Transport, buf: Any, op: ReduceOp, v: int, p: int, real: Any,
              tag: int) -> None:
    incoming = scratch(transport, buf, buf.size, tag)
    mask = 1
    while mask < p:
        peer = real(v ^ mask)
        transport.sendrecv(buf, peer, incoming, peer, tag)
        combine(buf, incoming, op)
        mask <<= 1


def rd_all_reduce(transport: Transport, buf: Any, op: ReduceOp, tag: int = 0) -> None:
    """All-reduce ``buf`` (1-D, contiguous) in place; doubling or Rabenseifner by size."""
    n, r = transport.size, transport.rank
    if n > 1 and buf.size > 0:
        p = 1 << (n.bit_length() - 1)
        rem = n - p
        if r < 2 * rem and r % 2 == 0:  # folded out: hand the buffer over, wait for the result
            transport.send(buf, r + 1, tag)
            transport.recv(buf, r + 1, tag)
            finalize(buf, op, n)
            return
        if r < 2 * rem:
            incoming = scratch(transport, buf, buf.size, tag)
            transport.recv(incoming, r - 1, tag)
            combine(buf, incoming, op)
            v = r // 2
        else:
            v = r - rem

        def real(u: int) -> int:
            return 2 * u + 1 if u < rem else u + rem

        if uses_halving(buf.nbytes, buf.size, n):
            halving_doubling(transport, buf, op, v, p, real, tag)
        else:
            _doubling(transport, buf, op, v, p, real, tag)
        if r < 2 * rem:
            transport.send(buf, r - 1, tag)
    finalize(buf, op, n)


def rd_cost(n: int, k: float, a: float, b: float, g: float) -> float:
    """Modelled time: doubling log2(p)(a + Kb + Kg), Rabenseifner 2 log2(p) a + 2K(p-1)/p b +
    K(p-1)/p g (p = 2^floor(log2 n)), plus a fold 2a + 2Kb + Kg when n is not a power of two."""
    p = 1 << (n.bit_length() - 1)
    lg = math.log2(p)
    fold = 0.0 if p == n else 2 * a + 2 * k * b + k * g
    if uses_halving(int(k), int(k), n):  # numel >= p holds for any K worth halving
        return fold + 2 * lg * a + 2 * k * (p - 1) / p * b + k * (p - 1) / p * g
    return fold + lg * (a + k * b + k * g)


RD = Algorithm("rd", rd_all_reduce, cost=rd_cost, constants=model(5.0, 2.5e-4))
