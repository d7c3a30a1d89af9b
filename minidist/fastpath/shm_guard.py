"""The guard line: each rank's (call number, fingerprint) slots in the node's control window.

    guard = node.guard                       # one per ShmNode (shm_window.py)
    k = guard.post(fp)                       # MPI's Allreduce: publish, post MPI's call, then
    guard.agrees(k, fp)                      #   compare once it completed
    guard.exchange(fp, what)                 # the mailbox all-reduce: publish, wait, compare

MPI's Allreduce cannot carry a tag, and the mailbox all-reduce sends no message at all, so the
call's fingerprint (``tag`` from the process group: what the call is, and its number) travels
beside the data. Before each guarded call a rank writes the fingerprint and then its call
number ``k`` into slot ``k % 4`` of its line; after completion (MPI) or while waiting
(mailbox) it reads slot ``k % 4`` of every peer::

    rank 0 line: [ (k-3, fp) | (k-2, fp) | (k-1, fp) | (k, fp) ]    4 slots of 2 int64 words
    rank 1 line: [ (k-3, fp) | (k-2, fp) | (k-1, fp) | (k, fp) ]    (one cache line)

A peer can be at most one call ahead (call k+1 cannot complete without this rank), so 4 slots
never wrap onto a slot still being read. Both kinds of call share the numbers, so a rank in one
and a rank in the other see each other's fingerprint at once: CollectiveMismatch on every
rank, not a timeout. Whatever a peer stored before its call number (its mailbox, or the data
MPI moved) is visible once the number is: x86 keeps stores in order; elsewhere ``fence``
(``MPI_Win_sync``) orders them.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

from minidist.comm.errors import CollectiveMismatch, CommTimeout

SLOTS = 4  # (call number, fingerprint) pairs per rank


class GuardLine:
    """The guard slots of every rank of one node (see the module docstring).

    Args:
        lines: per rank, its line as 8 int64 words (a ``memoryview`` cast to "q").
        rank: this rank on the node. prefix: "[rank r/N]" for messages.
        spins: busy polls before a waiting rank yields its core.
        timeout_s: how long a wait for the peers may take.
        poll: ``poll()`` -> an exception to raise while waiting (a peer's failure), or None.
        fence: ``MPI_Win_sync`` where stores may be reordered (not x86), else None.
    """

    def __init__(self, lines: list[Any], rank: int, prefix: str, spins: int, timeout_s: float,
                 poll: Callable[[], Exception | None], fence: Callable[[], None] | None) -> None:
        self.lines, self.rank, self.prefix = lines, rank, prefix
        self.spins, self.timeout_s, self.poll, self.fence = spins, timeout_s, poll, fence
        self.mine = lines[rank]
        self.peers = [g for j, g in enumerate(lines) if j != rank]
        for i in range(2 * SLOTS):  # zero my line before any peer can read it
            self.mine[i] = 0
        self.calls = 0  # guarded calls so far (MPI's Allreduce, the mailbox all-reduce)

    def post(self, fp: int) -> int:
        """Publish the fingerprint of my next guarded call; return its call number."""
        self.calls = k = self.calls + 1
        i = (k & 3) << 1
        if self.fence is not None:  # (weak memory order) what I stored before: visible first
            self.fence()
        self.mine[i + 1] = fp  # fingerprint first, then the call number that makes it valid
        self.mine[i] = k
        return k

    def agrees(self, k: int, fp: int) -> bool:
        """True when every peer's slot for call ``k`` holds ``(k, fp)`` (the fast check after
        an MPI call completed; ``mismatch`` names the ranks that differ)."""
        i = (k & 3) << 1
        for g in self.peers:
            if g[i] != k or g[i + 1] != fp:
                return False
        return True

    def exchange(self, fp: int, what: str) -> None:
        """``post(fp)``, wait until every peer posted the same call, compare fingerprints.

        Raises:
            CollectiveMismatch: a peer posted this call with another fingerprint.
            CommTimeout: a peer did not post it within ``timeout_s`` (names the ranks).
        """
        k = self.post(fp)
        i = (k & 3) << 1
        for g in self.peers:
            if g[i] != k:
                self._spin(g, i, k, what)
            if g[i + 1] != fp:
                bad = self.mismatch(k, fp, complete=False)
                raise CollectiveMismatch(
                    f"{self.prefix} {what}: rank{'s' if len(bad) > 1 else ''} "
                    f"{', '.join(map(str, bad))} called a different collective here (its call "
                    "fingerprint differs).")
        if self.fence is not None:  # (weak memory order) the peers' stores before their posts
            self.fence()

    def _spin(self, g: Any, i: int, k: int, what: str) -> None:
        """Spin (then yield) until ``g[i] == k``, with the deadline and the failure poll."""
        n, deadline = 0, None
        while g[i] != k:
            n += 1
            if n > self.spins:
                os.sched_yield()
                if n % 1024 == 0:
                    deadline = deadline or time.monotonic() + self.timeout_s
                    error = self.poll()  # e.g. a peer reported a failure
                    if error is not None and g[i] != k:
                        raise error
                    if time.monotonic() > deadline:
                        late = [j for j, p in enumerate(self.lines) if p[i] != k]
                        raise CommTimeout(
                            f"{self.prefix} {what}: ranks {late} did not arrive within "
                            f"{self.timeout_s:g}s. They are slow, stuck in another collective, "
                            "or dead; raise MINIDIST_TIMEOUT_S if only slow.")

    def mismatch(self, k: int, fp: int, complete: bool) -> list[int]:
        """Ranks whose slot for call ``k`` holds another fingerprint.

        ``complete``: the MPI call finished, so every peer has posted call ``k``; a peer whose
        slot holds another call number then counted its guarded calls differently, a mismatch
        too.
        """
        i, bad = (k & 3) << 1, []
        for j, g in enumerate(self.lines):
            if g[i] == k:
                if g[i + 1] != fp:
                    bad.append(j)
            elif complete:
                bad.append(j)
        return bad

    def ahead(self, peer: int) -> int:
        """The call number ``peer`` has posted beyond this rank's guarded calls, else 0.

        A peer that posted call ``calls + 1`` has finished every collective before it; if this
        rank still waits for that peer's message in one of those, the ranks diverged.
        """
        g = self.lines[peer]
        k = max(g[0], g[2], g[4], g[6])
        return k if k > self.calls else 0


__all__ = ["GuardLine", "SLOTS"]
