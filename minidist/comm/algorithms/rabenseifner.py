"""Recursive halving/doubling (Rabenseifner): ``rd``'s all-reduce of large messages.

Rabenseifner (large K): reduce-scatter by recursive HALVING (step k swaps half of the current
segment, keeps and reduces the other half), then all-gather by recursive DOUBLING (the same
partners in reverse order swap the finished segments):

  halving  step 0 (distance 2):  0<->2 keep [0,K/2)   1<->3 keep [0,K/2)   2,3 keep [K/2,K)
           step 1 (distance 1):  0<->1, 2<->3: each keeps a quarter, fully reduced
  doubling step 0 (distance 1), step 1 (distance 2): swap owned segments until all own [0,K)

Runs on the p = 2^floor(log2 N) ranks left after recursive_doubling.py's fold, in virtual
ranks. Cost: 2 log2(p) alpha + 2K(p-1)/p beta + K(p-1)/p gamma. Each element is reduced by
one rank and then copied, so every rank ends with identical bits.
"""

from __future__ import annotations

from typing import Any

from minidist.comm.algorithms.scratch import scratch
from minidist.comm.ops import ReduceOp, combine
from minidist.comm.transports.base import Transport

# At or above this many bytes, halving/doubling beats doubling (fewer bytes per rank); 64 KiB.
HALVING_MIN_BYTES = 64 * 1024


def uses_halving(nbytes: int, numel: int, n: int) -> bool:
    """Whether ``rd_all_reduce`` runs Rabenseifner (else plain doubling) for this message."""
    p = 1 << (n.bit_length() - 1)
    return nbytes >= HALVING_MIN_BYTES and numel >= p


def halving_doubling(transport: Transport, buf: Any, op: ReduceOp, v: int, p: int, real: Any,
                     tag: int) -> None:
    """Rabenseifner on the ``p`` (a power of two) ranks left after the fold: ``v`` is this
    rank's virtual rank, ``real(u)`` the real rank of virtual rank ``u``."""
    incoming = scratch(transport, buf, (buf.size + 1) // 2, tag)
    lo, hi = 0, buf.size
    steps = []
    mask = p >> 1
    while mask:  # reduce-scatter by recursive halving
        peer = real(v ^ mask)
        mid = lo + (hi - lo) // 2
        keep, give = ((mid, hi), (lo, mid)) if v & mask else ((lo, mid), (mid, hi))
        got = incoming[:keep[1] - keep[0]]
        transport.sendrecv(buf[give[0]:give[1]], peer, got, peer, tag)
        combine(buf[keep[0]:keep[1]], got, op)
        steps.append((peer, give, keep))
        lo, hi = keep
        mask >>= 1
    for peer, give, keep in reversed(steps):  # all-gather by recursive doubling
        transport.sendrecv(buf[keep[0]:keep[1]], peer, buf[give[0]:give[1]], peer, tag)
