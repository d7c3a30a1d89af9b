r"""Direct all-reduce: the naive oracle every other algorithm is tested against.

    rank:      1    2    3            gather: everyone sends its whole buffer to rank 0
               \    |    /            rank 0 adds them in rank order: x0 + x1 + x2 + x3
                '-> 0 <-'             scatter: rank 0 sends the result back to everyone
               /    |    \
               1    2    3

Step rule: ranks 1..N-1 send K bytes to 0 and receive K bytes from 0; rank 0 receives N-1 times,
reduces each into its buffer in rank order, then sends N-1 times.
Cost (alpha-beta): the root serializes everything, 2(N-1)(alpha + K beta) + (N-1) K gamma.
Invariant: the sum is computed once (on rank 0) in a fixed order, so every rank gets the same
bits, and the order equals the NumPy oracle ``x0 + x1 + ... + x_{N-1}``.
"""

from __future__ import annotations

from typing import Any

from minidist.comm.algorithms.registry import Algorithm, model
from minidist.comm.algorithms.scratch import scratch
from minidist.comm.ops import ReduceOp, combine, finalize
from minidist.comm.transports.base import Transport


def direct_all_reduce(transport: Transport, buf: Any, op: ReduceOp, tag: int = 0) -> None:
    """All-reduce ``buf`` (1-D, contiguous) in place through rank 0; see the module docstring."""
    n, r = transport.size, transport.rank
    if n > 1 and buf.size > 0:
        if r == 0:
            incoming = scratch(transport, buf, buf.size, tag)
            for src in range(1, n):
                transport.recv(incoming, src, tag)
                combine(buf, incoming, op)
            for dst in range(1, n):
                transport.send(buf, dst, tag)
        else:
            transport.send(buf, 0, tag)
            transport.recv(buf, 0, tag)
    finalize(buf, op, n)


def direct_cost(n: int, k: float, a: float, b: float, g: float) -> float:
    """Modelled time: 2(n-1) messages of K bytes through rank 0, (n-1) reductions of K."""
    return 2 * (n - 1) * (a + k * b) + (n - 1) * k * g


# The oracle every test compares with, not a contender of "auto".
DIRECT = Algorithm("direct", direct_all_reduce, cost=direct_cost, constants=model(5.0, 2.5e-4),
                   candidate=False)
