"""The small all-reduce of the shared-memory path: every rank drops its message in a mailbox.

    run = mailbox_all_reduce(node, flat)     # prepared once per buffer size and dtype
    run(flat, ReduceOp.SUM, tag)             # then per call: copy in, post, wait, add

For messages up to ``SMALL_BYTES`` (32 KiB) the cost is latency, not bytes, so the fewer steps
the better. Each rank owns two mailboxes in the node's control window (shm_window.py), used by
alternate calls, and the guard line that MPI's Allreduce already uses says which call a
mailbox holds. N=3, call k::

    rank 0 mailbox[k & 1]: [ a ]   guard slot k % 4: (k, fp)   (1) copy my message in
    rank 1 mailbox[k & 1]: [ b ]   guard slot k % 4: (k, fp)   (2) post (k, fp): fingerprint,
    rank 2 mailbox[k & 1]: [ c ]   guard slot k % 4: (k, fp)       then call number
                                                                (3) wait until every peer
    every rank: out = a + b + c (rank order: identical bits)        posted k; compare fps
                                                                (4) add the mailboxes

No barrier and no header row: the guard's call number is the "ready" flag and its fingerprint
the agreement check (``GuardLine.exchange``, shm_guard.py). Two mailboxes suffice: a rank
writes mailbox ``k & 1`` again at call k+2 only after every peer posted k+1, which each does
after reading call k. Calls of this kind and MPI's Allreduce share the call numbers, so a
rank in one and a rank in the other see each other's fingerprint at once (a mismatch, not a
timeout).

A call from the process group carries its fingerprint in ``tag`` (a mismatch is then
diagnosed from the ledgers: comm/calls.py). A direct call (``tag`` 0) posts a hash of (numel,
dtype, op) instead and keeps the three in its mailbox's first line (rewritten only when they
change), so its mismatch names the values.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minidist.comm.errors import CollectiveMismatch
from minidist.comm.ops import ReduceOp, combine, finalize
from minidist.fastpath.shm_checks import DTYPE_CODES, describe
from minidist.fastpath.shm_window import LINE, ShmNode

MAX_PREPARED = 64  # mailbox runs kept per node (a training job uses a few sizes)


class MailboxAllReduce:
    """The mailbox all-reduce of ``numel`` elements of ``dtype`` on ``node`` (module doc)."""

    def __init__(self, node: ShmNode, dtype: np.dtype, numel: int) -> None:
        self.node, self.guard = node, node.guard
        self.n = node.size
        # boxes[half]: every rank's message (as ``dtype``); mine[half], rest[half]: my box and
        # the boxes after the first two; lines[half]: my (numel, dtype, op) line
        self.boxes = [[b[LINE: LINE + numel * dtype.itemsize].view(dtype) for b in half]
                      for half in node.mailboxes]
        self.mine = [boxes[node.rank] for boxes in self.boxes]
        self.rest = [boxes[2:] for boxes in self.boxes]
        self.lines = [half[node.rank][:LINE].view(np.int64) for half in node.mailboxes]
        code = DTYPE_CODES.get(dtype, 100 + dtype.num)
        self.lines_of = {op: (numel, code, op.code) for op in ReduceOp}  # what a line says
        self.stamped: list[Any] = node.extra.setdefault("mailbox_lines", [None, None])
        self.what = 'all_reduce(algorithm="shm")'

    def __call__(self, flat: np.ndarray, op: ReduceOp, tag: int = 0) -> None:
        half = (self.guard.calls + 1) & 1  # the call number guard.exchange gives this call
        self.mine[half][...] = flat                                       # (1)
        try:
            self.guard.exchange(tag or self.stamp(half, op), self.what)  # (2), (3)
        except CollectiveMismatch as e:
            raise (e if tag else self.mismatch(half, e)) from None
        if self.n > 1:                                                    # (4)
            boxes = self.boxes[half]
            op.ufunc(boxes[0], boxes[1], flat)  # (rank order: every rank the same bits)
            for box in self.rest[half]:
                combine(flat, box, op)
        if op.averages:
            finalize(flat, op, self.n)

    def stamp(self, half: int, op: ReduceOp) -> int:
        """A direct call's fingerprint, a hash of (numel, dtype, op), which it also writes in
        its mailbox's line (only when the line holds another op) for ``mismatch`` to read."""
        line = self.lines_of[op]
        if self.stamped[half] is not line:  # (which line each of my mailboxes holds now)
            self.lines[half][:3] = line
            self.stamped[half] = line
        return hash(line)

    def mismatch(self, half: int, error: CollectiveMismatch) -> CollectiveMismatch:
        """A direct call's mismatch: the (numel, dtype, op) of a peer that passed others, else
        ``error`` (the group's calls are diagnosed from the ledgers instead)."""
        node = self.node
        lines = [box[:LINE].view(np.int64)[:3].tolist() for box in node.mailboxes[half]]
        for j, line in enumerate(lines):
            if line != lines[node.rank]:
                return CollectiveMismatch(
                    f"{node.prefix} {self.what}: rank {j} passed {describe(line)} but rank "
                    f"{node.rank} passed {describe(lines[node.rank])}. Every rank must pass "
                    "the same shape, dtype and op.")
        return error


def mailbox_all_reduce(node: ShmNode, flat: np.ndarray) -> MailboxAllReduce:
    """The node's mailbox all-reduce for ``flat``'s size and dtype (made once, then reused)."""
    runs = node.extra.setdefault("mailbox", {})
    key = (flat.dtype, flat.size)
    run = runs.get(key)
    if run is None:
        if len(runs) >= MAX_PREPARED:
            runs.clear()
        run = runs[key] = MailboxAllReduce(node, flat.dtype, flat.size)
    return run


__all__ = ["MailboxAllReduce", "mailbox_all_reduce"]
