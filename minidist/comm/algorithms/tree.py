"""Binomial-tree all-reduce: reduce to a root up a binomial tree, then broadcast down it.

Binomial tree, N=8, root 0 (works for any N; ranks are taken relative to the root,
v = (rank - root) % N, and v sends to v - 2^k in round k when v % 2^(k+1) == 2^k):

  reduce    round 0: 1->0 3->2 5->4 7->6    round 1: 2->0 6->4    round 2: 4->0
  broadcast the same edges reversed:  round 0: 0->4   round 1: 0->2 4->6   round 2: 0->1 2->3 ...

Step rule: in round k, v with bit k set sends its partial result to v - 2^k and stops; v with
bit k clear receives from v + 2^k (if it exists) and reduces it into its buffer.
Cost: 2 ceil(log2 N) (alpha + K beta) + ceil(log2 N) K gamma on the critical path; per rank at
most 1 + ceil(log2 N) messages of K bytes. Best for small K (few, whole-buffer messages).
Invariant: the root alone computes the final value and broadcasts it, so every rank ends
with identical bits. ``tree_reduce`` and ``tree_broadcast`` are reused by ``reduce`` and
``broadcast`` with any root.
"""

from __future__ import annotations

import math
from typing import Any

from minidist.comm.algorithms.registry import Algorithm, model
from minidist.comm.algorithms.scratch import scratch
from minidist.comm.ops import ReduceOp, combine, finalize
from minidist.comm.transports.base import Transport


def tree_reduce(transport: Transport, buf: Any, op: ReduceOp, root: int = 0, tag: int = 0) -> None:
    """Reduce every rank's ``buf`` into ``buf`` on ``root`` (others keep partial results).

    AVG is not divided here; the caller finalizes on the root.
    """
    n = transport.size
    v = (transport.rank - root) % n
    mask = 1
    while mask < n:
        if v & mask:
            transport.send(buf, (v - mask + root) % n, tag)
            return
        if v + mask < n:
            incoming = scratch(transport, buf, buf.size, tag)
            transport.recv(incoming, (v + mask + root) % n, tag)
            combine(buf, incoming, op)
        mask <<= 1


def tree_broadcast(transport: Transport, buf: Any, root: int = 0, tag: int = 0) -> None:
    """Copy ``buf`` of ``root`` into ``buf`` of every rank down the binomial tree."""
    n = transport.size
    v = (transport.rank - root) % n
    mask = 1
    while mask < n:  # find the round in which this rank receives (the root never does)
        if v & mask:
            transport.recv(buf, (v - mask + root) % n, tag)
            break
        mask <<= 1
    mask >>= 1
    while mask > 0:  # then forward to the children below that round
        if v + mask < n:
            transport.send(buf, (v + mask + root) % n, tag)
        mask >>= 1


def tree_all_reduce(transport: Transport, buf: Any, op: ReduceOp, tag: int = 0) -> None:
    """All-reduce ``buf`` (1-D, contiguous) in place: tree reduce to 0, then tree broadcast."""
    if transport.size > 1 and buf.size > 0:
        tree_reduce(transport, buf, op, 0, tag)
        tree_broadcast(transport, buf, 0, tag)
    finalize(buf, op, transport.size)


def tree_cost(n: int, k: float, a: float, b: float, g: float) -> float:
    """Modelled time: 2 ceil(log2 n) messages of K bytes, ceil(log2 n) reductions of K."""
    lg = math.ceil(math.log2(n))
    return 2 * lg * (a + k * b) + lg * k * g


TREE = Algorithm("tree", tree_all_reduce, cost=tree_cost, constants=model(5.0, 2.5e-4))
