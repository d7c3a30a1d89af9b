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
  each other's messages; ``stream_of(tag)`` recovers the stream;
- every blocking call honours ``timeout_s`` (default ``MINIDIST_TIMEOUT_S``, 300 s) and raises
  ``CommTimeout`` with the rank, the operation and the peer instead of hanging forever.

Every transport also has these attributes and methods (the defaults below suit a transport
without the feature), so callers use them directly instead of probing::

    t.timeout_s        deadline of every blocking wait (seconds)
    t.thread_safe      True when several threads may call it at once (async work)
    t.abort(code)      end this rank's part of the job now (default: ``close()``)
    t.split(members, timeout_s)   a transport over some ranks (sub-groups)
    t.side_channel     small messages beside the data ones (side.py: failure notices)
    t.traffic()        payload bytes sent, by the peer's node (nodes.py)
    t.mpi, t.cuda_aware()   MPI-only code's handles; whether device buffers pass as they are

Polling: waits that outlast their spin phase call ``t.poll_hook(src, tag)`` every ``POLL_S``
(the watch wing installs it; ``src`` None for collective waits). It returns an exception when
the wait cannot succeed (a peer failed, or sent a message of ANOTHER call on this stream), and
the wait raises it unless one more test shows the message arrived after all (race-free).
"""

from __future__ import annotations

import abc
import os
import time
from typing import Any, Callable

import numpy as np

from minidist.comm.transports.nodes import (ByteCounters, host_machine_key,  # noqa: F401
                                            set_peer_nodes)  # (re-exported)
from minidist.comm.transports.side import (NO_SIDE_CHANNEL, SIDE_BYE, SIDE_DONE,  # noqa: F401
                                           SIDE_FAIL, SIDE_KINDS, SideChannel)  # (re-exported)
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


def poller(transport: Transport, src: int | None, tag: int) -> Callable[[], Any] | None:
    """The ``poll`` argument of ``wait_until`` for a wait of ``transport`` on ``(src, tag)``."""
    hook = transport.poll_hook
    return None if hook is None else (lambda: hook(src, tag))


class Request(abc.ABC):
    """Handle of a non-blocking send or receive."""

    @abc.abstractmethod
    def wait(self, timeout_s: float | None = None) -> None:
        """Block until the operation completes; raise CommTimeout after ``timeout_s``."""

    @abc.abstractmethod
    def test(self) -> bool:
        """True once the operation has completed (never blocks)."""


LINE_BYTES = 64  # a cache line


def from_line(raw: np.ndarray, nbytes: int) -> np.ndarray:
    """``nbytes`` of the byte array ``raw``, from its first cache-line boundary on (``raw``
    holds ``nbytes + LINE_BYTES``)."""
    start = -raw.ctypes.data % LINE_BYTES
    return raw[start: start + nbytes]


def line_aligned_empty(numel: int, dtype: Any) -> np.ndarray:
    """``np.empty(numel, dtype)`` whose first element starts on a cache line (NumPy's own
    large arrays start 16 bytes into one): DDP's gradient slots sit on cache lines of the
    bucket, so a matrix product writes whole lines."""
    dt = np.dtype(dtype)
    nbytes = numel * dt.itemsize
    return from_line(np.empty(nbytes + LINE_BYTES, np.uint8), nbytes).view(dt)


class Transport(ByteCounters, abc.ABC):
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
    mpi: Any = None  # MPI transports: their MPIHandles (communicators) for MPI-only code
    side_channel: SideChannel = NO_SIDE_CHANNEL  # each transport with peers sets its own
    thread_safe: bool = True  # MPI: only with MPI_THREAD_MULTIPLE
    subgroups_made: int = 0  # how many ``split`` calls this rank made (numbers the groups)
    one_process: bool = False  # every rank lives in this process (threads, local): one node

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
        """A 1-D communication buffer where this transport moves data best (the default: a
        plain array, a NumPy one starting on a cache line); the process group and DDP's
        buckets allocate through here."""
        if xp is not np:
            return xp.empty(int(numel), dtype=dtype)  # (device memory: 256-byte aligned)
        return line_aligned_empty(int(numel), dtype)

    def cuda_aware(self) -> bool:
        """Whether GPU buffers may be passed to this transport as they are (a CUDA-aware MPI);
        False: their collectives are staged through host memory (minidist.fastpath.staging)."""
        return False

    def split(self, members: list[int], timeout_s: float) -> Transport | None:
        """A transport over ``members`` (ranks of this one; index = rank in the new one), None
        on the other ranks; collective (``new_group`` builds sub-groups through it). The
        default is a view sharing this transport's messages in a tag space of its own
        (subgroup.py); MPI splits its communicator."""
        from minidist.comm.transports.subgroup import split_view
        return split_view(self, members, timeout_s)

    def abort(self, code: int = 1) -> None:
        """End this rank's part of the job now (an uncaught exception, Ctrl-C): the default
        closes the transport, so blocked peers fail fast, and returns; MPI's ``MPI_Abort``
        ends every rank and does not return (``abort_ends_job``)."""
        self.close()

    def close(self) -> None:
        """Release sockets, windows, threads. Idempotent."""
