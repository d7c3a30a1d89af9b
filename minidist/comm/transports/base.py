"""The Transport: the only thing a collective algorithm sees.

A transport moves bytes of contiguous arrays between ranks ``0..size-1``. Every algorithm in
``minidist.comm.algorithms`` is written against this interface only, so one ring runs over MPI,
TCP sockets, in-process threads (for fast tests) or a single process.

    t.send(buf, dst)                         blocking; returns when buf may be reused
    t.recv(buf, src)                         blocking; fills buf (same numel and dtype as sent)
    t.sendrecv(sendbuf, dst, recvbuf, src)   both at once (never deadlocks in a ring)
    req = t.isend(buf, dst); req.wait()      non-blocking variants; wait(timeout_s) raises
    req = t.irecv(buf, src); req.wait()      CommTimeout naming the peer when it expires

Rules every implementation keeps:
- buffers are C-contiguous arrays (numpy, or cupy where the transport supports device memory);
  a transport never pickles them;
- messages between one (src, dst, tag) pair arrive in the order they were sent;
- ``tag`` separates independent streams; algorithms pass the tag they were given through
  unchanged. The process group builds each collective's tag from its stream (the caller's
  ``tag`` argument, ``0 <= tag < MAX_STREAMS``) in the low bits and the call's fingerprint in
  the high bits (``comm/calls.py: wire_tag``), so calls that differ across ranks never match
  each other's messages; ``stream_of(tag)`` recovers the stream (scratch buffers are cached per stream);
- every blocking call honours ``timeout_s`` (default ``MINIDIST_TIMEOUT_S``, 300 s) and raises
  ``CommTimeout`` with the rank, the operation and the peer instead of hanging forever.

Side channel (used only when a collective fails, and at ``destroy_process_group``): small byte
messages of a few kinds (``SIDE_FAIL``, ``SIDE_BYE``, ``SIDE_DONE``) that travel apart from the
data messages, so they get through while a collective is stuck::

    side = t.side_channel                    # a SideChannel (one rank: NO_SIDE_CHANNEL)
    side.send(dst, SIDE_FAIL, payload)       # never blocks; a lost peer is ignored
    side.try_recv(src, SIDE_FAIL)            # bytes, or None when nothing arrived yet
    side.pending(SIDE_FAIL)                  # a peer with such a message unread, or None
    side.peer_lost(src)                      # why ``src`` is unreachable, or None
    side.stray_tag(src, tag)                 # a message from src on tag's stream, other tag

Capabilities: every transport has these attributes and methods (the defaults below suit a
transport without the feature), so callers use them directly instead of probing::

    t.timeout_s                  deadline of every blocking wait (seconds)
    t.abort(code)                end this rank's part of the job now (default: ``close()``)
    t.abort_ends_job             True when ``abort`` takes every rank down at once (MPI Abort)
    t.mpi                        MPI transports: its communicators (``MPIHandles``), else None
    t.cuda_aware()               True when device (CuPy) buffers may be passed as they are
    t.thread_safe                True when several threads may call it at once (async work)
    t.split(members, timeout_s)  a transport over some ranks (sub-groups; see ``split``)

Byte counters: every transport counts the payload bytes it sends, split by where the peer
lives (``set_peer_nodes``: the node of every rank, from ``minidist.comm.topology``)::

    t.traffic()          # {"intra_node": bytes to ranks on my node, "inter_node": to others}
    t.reset_traffic()    # zero both (a test or benchmark counts one collective)

Polling: waits that outlast their spin phase call ``t.poll_hook(src, tag)`` every ``POLL_S``
(the process group installs it; ``src`` None for collective waits). It returns an exception
when the wait cannot succeed - a peer reported a failure, a peer sent a message of ANOTHER call
on this stream (a mismatch: per-pair order means the awaited one would have come first), a
peer already finished all its collectives - and the wait raises it unless one more test shows
the message arrived after all (which makes the check race-free).
"""

from __future__ import annotations

import abc
import os
import time
from typing import Any, Callable

import numpy as np

from minidist.envvars import env

DEFAULT_TIMEOUT_S = float(env("MINIDIST_TIMEOUT_S"))

# Tag layout: stream in the low STREAM_BITS, the call's fingerprint (never 0) above them.
STREAM_BITS = 10
MAX_STREAMS = 1 << STREAM_BITS
_STREAM_MASK = MAX_STREAMS - 1
# Sub-groups made by ``Transport.split`` over one transport (TCP, threads) share its messages:
# each group's tags carry its group number in the bits from GROUP_SHIFT up, the world's tags
# stay below (``Transport.max_tag``), so no group ever matches another group's message.
GROUP_SHIFT = 40
MAX_GROUPS = (1 << 22) - 1  # group numbers 1..MAX_GROUPS (tags stay below 2**62)
_GROUP_MASK = MAX_GROUPS << GROUP_SHIFT

# Side-channel message kinds.
SIDE_FAIL = 1  # "my collective failed; here is my ledger"
SIDE_BYE = 2   # destroy_process_group: "I am done; here are my collective counts"
SIDE_DONE = 3  # "I have read every ledger" (lets every rank print before the job ends)
SIDE_KINDS = (SIDE_FAIL, SIDE_BYE, SIDE_DONE)


def stream_of(tag: int) -> int:
    """The stream of a message tag built by ``calls.wire_tag``: the caller's ``tag``, plus the
    bits of the sub-group that sent it (so streams of different groups never compare equal)."""
    return tag & (_STREAM_MASK | _GROUP_MASK)


def has_fingerprint(tag: int) -> bool:
    """True when ``tag`` carries a call fingerprint (the ledger is on)."""
    return tag > _STREAM_MASK


def fingerprint_mask(max_tag: int) -> int:
    """The bits of a fingerprint that fit above the stream bits of a tag <= ``max_tag``."""
    return (1 << ((max_tag + 1).bit_length() - 1 - STREAM_BITS)) - 1


POLL_S = 0.002  # how often a waiting rank runs the poll hook (slow phase only)
PollHook = Callable[[Any, int], Any]  # (src or None, tag) -> exception to raise, or None


def wait_until(test: Callable[[], bool], timeout_s: float, timed_out: Callable[[], Exception],
               poll: Callable[[], Exception | None] | None = None) -> None:
    """The slow phase of a wait: ``test()`` until it is true, yielding the core in between.

    Raises ``timed_out()`` after ``timeout_s``. Every ``POLL_S`` (never within the first
    ``POLL_S``, so short waits pay nothing) it calls ``poll()``; an exception it returns is
    raised unless ``test()`` succeeds right after (see "Polling" in the module docstring).
    """
    now = time.monotonic()
    deadline, next_poll = now + timeout_s, now + POLL_S
    while not test():
        now = time.monotonic()
        if now > deadline:
            raise timed_out()
        if poll is not None and now > next_poll:
            next_poll = now + POLL_S
            error = poll()
            if error is not None:
                if test():  # it arrived after all: the suspicion was a race, not a mismatch
                    return
                raise error
        os.sched_yield()  # releases the GIL and the core (time.sleep(0): a scheduler tick)


def set_peer_nodes(transport: Transport, nodes: list[int]) -> None:
    """Tell ``transport``'s byte counters the node of every rank (``nodes[r]``); counts restart
    at 0 (topology.py calls it once the nodes are known)."""
    me = nodes[transport.rank]
    transport._other_node = [int(n != me) for n in nodes]
    transport._sent = [0, 0]


def poller(transport: Transport, src: int | None, tag: int) -> Callable[[], Any] | None:
    """The ``poll`` argument of ``wait_until`` for a wait of ``transport`` on ``(src, tag)``."""
    hook = transport.poll_hook
    return None if hook is None else (lambda: hook(src, tag))


def host_machine_key() -> int:
    """An integer equal on ranks that share one machine (a hash of the host name); MPI asks
    MPI instead (``MPIHandles.machine_key``: its shared-memory split)."""
    import hashlib
    import socket

    digest = hashlib.blake2b(socket.gethostname().encode(), digest_size=7).digest()
    return int.from_bytes(digest, "little")


class Request(abc.ABC):
    """Handle of a non-blocking send or receive."""

    @abc.abstractmethod
    def wait(self, timeout_s: float | None = None) -> None:
        """Block until the operation completes; raise CommTimeout after ``timeout_s``."""

    @abc.abstractmethod
    def test(self) -> bool:
        """True once the operation has completed (never blocks)."""


class SideChannel:
    """Small byte messages beside the data messages (failure notices, farewells); see the
    module docstring. This base is the "no side channel" of a one-rank transport: nothing ever
    arrives; each transport with peers has its own (``transport.side_channel``)."""

    def send(self, dst: int, kind: int, payload: bytes) -> None:
        """Queue ``payload`` for rank ``dst``; never blocks, never raises for a lost peer."""
        raise NotImplementedError("this transport has no side channel (one rank, no peers)")

    def try_recv(self, src: int, kind: int) -> bytes | None:
        """The next side message of ``kind`` from ``src``, or None if none arrived yet."""
        return None

    def pending(self, kind: int) -> int | None:
        """A peer whose side message of ``kind`` waits unread, or None (cheap; polled)."""
        return None

    def stray_tag(self, src: int, tag: int) -> int | None:
        """The tag of a data message from ``src`` waiting unmatched on ``tag``'s stream with
        another tag (another call's fingerprint), or None."""
        return None

    def peer_lost(self, src: int) -> str | None:
        """Why rank ``src`` can no longer be reached (connection closed), or None."""
        return None


NO_SIDE_CHANNEL = SideChannel()


class Transport(abc.ABC):
    """Point-to-point messaging between ``size`` ranks; see the module docstring."""

    rank: int
    size: int
    name: str = "transport"
    # The largest message tag (MPI: its TAG_UB attribute); the bits above it carry sub-group
    # numbers on transports that split generically (see GROUP_SHIFT).
    max_tag: int = (1 << GROUP_SHIFT) - 1
    poll_hook: PollHook | None = None  # installed by the process group (see "Polling")
    timeout_s: float = DEFAULT_TIMEOUT_S  # deadline of every blocking wait (set per instance)
    abort_ends_job: bool = False  # abort() ends every rank (MPI), not only this one
    # MPI transports: their MPIHandles (communicators, the mpi4py module) for MPI-only code
    # (MPI's own Allreduce, shared-memory windows); None elsewhere.
    mpi: Any = None
    side_channel: SideChannel = NO_SIDE_CHANNEL  # each transport with peers sets its own
    # Calls from several threads at once are safe (async collectives run on a worker thread;
    # MPI: only with MPI_THREAD_MULTIPLE).
    thread_safe: bool = True
    subgroups_made: int = 0  # how many ``split`` calls this rank made (numbers the groups)

    # Class defaults: a transport needs no constructor call for these.
    one_process: bool = False  # every rank lives in this process (threads, local): one node
    _other_node: list | None = None  # per rank: 1 if it lives on another node, else 0
    _sent: list | None = None  # payload bytes sent: [to my node, to other nodes]

    def _count_sent(self, dst: int, nbytes: int) -> None:
        """Add ``nbytes`` sent to ``dst`` to the byte counters (every send path calls this)."""
        sent, other = self._sent, self._other_node
        if sent is None:
            sent = self._sent = [0, 0]
        sent[other[dst] if other is not None else 0] += nbytes

    def traffic(self) -> dict:
        """Payload bytes this rank sent since the last reset, split by the peer's node.

        Returns:
            ``{"intra_node": int, "inter_node": int}``; every rank counts as on my node until
            ``set_peer_nodes`` was called (the process group does it at construction).
        """
        sent = self._sent or [0, 0]
        return {"intra_node": int(sent[0]), "inter_node": int(sent[1])}

    def reset_traffic(self) -> None:
        """Zero the byte counters."""
        self._sent = [0, 0]

    @abc.abstractmethod
    def isend(self, buf: Any, dst: int, tag: int = 0) -> Request:
        """Start sending the contiguous array ``buf`` to rank ``dst``."""

    @abc.abstractmethod
    def irecv(self, buf: Any, src: int, tag: int = 0) -> Request:
        """Start receiving into the contiguous array ``buf`` from rank ``src``."""

    def send(self, buf: Any, dst: int, tag: int = 0, timeout_s: float | None = None) -> None:
        """Send ``buf`` to ``dst``; return when ``buf`` may be reused."""
        self.isend(buf, dst, tag).wait(timeout_s)

    def recv(self, buf: Any, src: int, tag: int = 0, timeout_s: float | None = None) -> None:
        """Receive from ``src`` into ``buf``."""
        self.irecv(buf, src, tag).wait(timeout_s)

    def sendrecv(self, sendbuf: Any, dst: int, recvbuf: Any, src: int, tag: int = 0,
                 timeout_s: float | None = None) -> None:
        """Send to ``dst`` and receive from ``src`` at the same time (safe in a ring)."""
        r = self.irecv(recvbuf, src, tag)
        s = self.isend(sendbuf, dst, tag)
        s.wait(timeout_s)
        r.wait(timeout_s)

    def alloc_buffer(self, numel: int, dtype: Any, xp: Any = np) -> Any:
        """Allocate a 1-D communication buffer where this transport moves data best.

        The process group (and DDP's buckets) allocate through here, so a transport may place
        buffers in shared memory or pinned memory. The default is a plain array.
        """
        return xp.empty(int(numel), dtype=dtype)

    def cuda_aware(self) -> bool:
        """Whether GPU buffers may be passed to this transport as they are (a CUDA-aware MPI);
        False: their collectives are staged through host memory (minidist.fastpath.staging)."""
        return False

    def split(self, members: list[int], timeout_s: float) -> Transport | None:
        """A transport over ``members`` (ranks of this one; index = rank in the new one).

        Collective: every rank of this transport calls it with the same ``members``, in the
        same order as its other ``split`` calls; ranks outside ``members`` get None (and still
        count the call, so group numbers agree everywhere). ``new_group`` builds sub-groups
        through it. The default is a ``SubgroupTransport`` view that shares this transport's
        messages in a tag space of its own; MPI overrides it with ``MPI_Comm_split``.

        Raises:
            ValueError: more than ``MAX_GROUPS`` sub-groups on this transport.
        """
        from minidist.comm.transports.subgroup import SubgroupTransport
        self.subgroups_made += 1
        if self.subgroups_made > MAX_GROUPS:
            raise ValueError(f"[rank {self.rank}/{self.size}] new_group: more than {MAX_GROUPS} "
                             "sub-groups on one transport. Reuse the groups you made.")
        if self.rank not in members:
            return None
        return SubgroupTransport(self, members, self.subgroups_made, timeout_s)

    def abort(self, code: int = 1) -> None:
        """End this rank's part of the job now, after an uncaught exception or Ctrl-C.

        The default closes the transport, so peers blocked on this rank fail fast with a
        closed connection instead of waiting for their deadline, and returns (the caller then
        exits). MPI overrides it with ``MPI_Abort``, which ends every rank and does not return
        (``abort_ends_job`` is True there).
        """
        self.close()

    def close(self) -> None:
        """Release sockets, windows, threads. Idempotent."""
