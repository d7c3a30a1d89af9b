"""A sub-group's transport: some ranks of a parent transport, renumbered, in a tag space of their own.

    sub = parent.split([1, 3], timeout_s)    # collective over the parent; None on ranks 0 and 2
    sub.rank, sub.size                       # parent rank 3 is rank 1 of 2 here
    ring_all_reduce(sub, buf, ReduceOp.SUM)  # any algorithm: it only sees a Transport

``new_group(ranks)`` builds its ProcessGroup on such a view wherever the transport has no
sub-communicators of its own (TCP, threads; MPI splits its communicator instead). Every message
goes through the parent, so the view owns no sockets or threads::

    group rank g  ->  parent rank members[g]
    group tag  t  ->  parent tag  t | (group number << GROUP_SHIFT)      (t <= max_tag)
    side kind  k  ->  parent kind k + (group number << SIDE_SHIFT)

The group number counts the parent's ``split`` calls, which every rank makes in the same order,
so it agrees on every member. The world's tags stay below ``1 << GROUP_SHIFT``, so a group's
messages can never match the world's or another group's, and ``stray_tag`` (which compares
``stream_of``, group bits included) never mistakes another group's message for a mismatch.

Waits on a view run the view's own poll hook (its ProcessGroup's failure checks), not the
parent's: a request of the parent is polled with ``test()`` inside ``wait_until`` and then
completed with the parent's ``wait``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minidist.comm.errors import CommTimeout
from minidist.comm.transports.base import (GROUP_SHIFT, MAX_GROUPS, Request, SideChannel,
                                           Transport, poller, wait_until)

SIDE_SHIFT = 8  # side kinds of a group: kind + (group number << SIDE_SHIFT)


class _SubgroupRequest(Request):
    """A parent request, waited with the view's deadline and poll hook, in the view's ranks."""

    def __init__(self, view: SubgroupTransport, inner: Request, op: str, peer: int, tag: int,
                 nbytes: int) -> None:
        self.view, self.inner, self.op, self.peer, self.tag = view, inner, op, peer, tag
        self.nbytes = nbytes

    def test(self) -> bool:
        return self.inner.test()

    def wait(self, timeout_s: float | None = None) -> None:
        view = self.view
        timeout_s = view.timeout_s if timeout_s is None else timeout_s
        if not self.inner.test():
            def timed_out() -> CommTimeout:
                return CommTimeout(
                    f"[rank {view.rank}/{view.size}] {self.op}(peer={self.peer}, tag={self.tag}, "
                    f"{self.nbytes} bytes) in the sub-group of parent ranks {view.members}: not "
                    f"complete after {timeout_s:g} s. Group rank {self.peer} (parent rank "
                    f"{view.members[self.peer]}) is late, stuck in another collective, or dead; "
                    "every member must call the group's collectives in the same order.")
            wait_until(self.inner.test, timeout_s, timed_out, poller(view, self.peer, self.tag))
        self.inner.wait(timeout_s)  # done: completes it (e.g. copies an early message out)


class _SubgroupSideChannel(SideChannel):
    """A sub-group's side channel: the parent's, in the group's own kinds."""

    def __init__(self, t: "SubgroupTransport") -> None:
        self.t = t

    def send(self, dst: int, kind: int, payload: bytes) -> None:
        t = self.t
        t.parent.side_channel.send(t.members[dst], kind + t._side_bits, payload)

    def try_recv(self, src: int, kind: int) -> bytes | None:
        t = self.t
        return t.parent.side_channel.try_recv(t.members[src], kind + t._side_bits)

    def pending(self, kind: int) -> int | None:
        t = self.t
        peer = t.parent.side_channel.pending(kind + t._side_bits)
        return None if peer is None else t._of_parent.get(peer)

    def stray_tag(self, src: int, tag: int) -> int | None:
        t = self.t
        other = t.parent.side_channel.stray_tag(t.members[src], tag | t._bits)
        return None if other is None else other & ~t._bits

    def peer_lost(self, src: int) -> str | None:
        t = self.t
        return t.parent.side_channel.peer_lost(t.members[src])


class SubgroupTransport(Transport):
    """The ranks ``members`` of ``parent`` as a transport of their own (see the module docstring).

    Args:
        parent: the transport every message goes through (it stays owned by its group).
        members: parent ranks, in group-rank order; this rank must be one of them.
        group: the group number (1..MAX_GROUPS), the same on every member.
        timeout_s: deadline of this group's waits.
    """

    def __init__(self, parent: Transport, members: list[int], group: int,
                 timeout_s: float) -> None:
        self.parent, self.members, self.group = parent, list(members), int(group)
        self.rank, self.size = self.members.index(parent.rank), len(self.members)
        self.name = parent.name
        self.timeout_s = float(timeout_s)
        self.thread_safe = parent.thread_safe
        self._bits = self.group << GROUP_SHIFT
        self._side_bits = self.group << SIDE_SHIFT
        self._of_parent = {p: g for g, p in enumerate(self.members)}
        self.side_channel = _SubgroupSideChannel(self)

    def isend(self, buf: Any, dst: int, tag: int = 0) -> Request:
        inner = self.parent.isend(buf, self.members[dst], tag | self._bits)
        return _SubgroupRequest(self, inner, "isend", dst, tag, buf.nbytes)

    def irecv(self, buf: Any, src: int, tag: int = 0) -> Request:
        inner = self.parent.irecv(buf, self.members[src], tag | self._bits)
        return _SubgroupRequest(self, inner, "irecv", src, tag, buf.nbytes)

    def alloc_buffer(self, numel: int, dtype: Any, xp: Any = np) -> Any:
        return self.parent.alloc_buffer(numel, dtype, xp)

    # -- side channel, in the group's own kinds ---------------------------------------------
    def split(self, members: list[int], timeout_s: float) -> Transport | None:
        raise NotImplementedError(
            f"[rank {self.rank}/{self.size}] new_group(ranks={members}) on a sub-group: make "
            "every group from the world group (minidist.new_group with world ranks).")

    def close(self) -> None:
        """Nothing to release: the parent's group owns the sockets and threads."""


def split_view(parent: Transport, members: list[int], timeout_s: float) -> Transport | None:
    """``Transport.split`` of a transport without sub-communicators: a ``SubgroupTransport``
    over ``members`` in a tag space of its own (None on ranks outside ``members``).

    Collective: every rank of ``parent`` calls it with the same ``members``, in the same order
    as its other ``split`` calls; ranks outside still count the call, so group numbers agree.

    Raises:
        ValueError: more than ``MAX_GROUPS`` sub-groups on this transport.
    """
    parent.subgroups_made += 1
    if parent.subgroups_made > MAX_GROUPS:
        raise ValueError(f"[rank {parent.rank}/{parent.size}] new_group: more than {MAX_GROUPS} "
                         "sub-groups on one transport. Reuse the groups you made.")
    if parent.rank not in members:
        return None
    return SubgroupTransport(parent, members, parent.subgroups_made, timeout_s)
