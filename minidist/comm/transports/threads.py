"""In-process transport: N ranks as N threads of one process, for fast tests of every algorithm.

    from minidist.comm.transports.threads import run_threads
    def body(t):                          # t: this thread's ThreadTransport (t.rank, t.size)
        buf = np.full(10, t.rank, np.float32)
        ring_all_reduce(t, buf, ReduceOp.SUM)
        return buf
    results = run_threads(4, body, timeout_s=30)   # list indexed by rank; raises naming the rank

How it works: one ``ThreadWorld`` holds a mailbox (a FIFO) per (src, dst, tag) under one
condition variable. ``isend`` COPIES the bytes into the mailbox and completes at once (an eager
send, like MPI's for small messages), so a sender may reuse its buffer immediately and message
semantics match real messaging. ``irecv`` completes when a message is in its mailbox; the sizes
must match exactly (a mismatch raises CommError naming both ranks).

Counting hook for structural tests: every transport counts ``messages_sent`` and ``bytes_sent``,
and ``world.log`` records ``(src, dst, tag, nbytes)`` of every message in send order.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

import numpy as np

from minidist.comm.errors import CommError, CommTimeout
from minidist.comm.transports.base import DEFAULT_TIMEOUT_S, Request, Transport
from minidist.comm.transports.side import ThreadSideChannel


class ThreadWorld:
    """Shared state of ``size`` thread ranks: the mailboxes, a message log, an abort flag."""

    def __init__(self, size: int, timeout_s: float | None = None) -> None:
        if size < 1:
            raise ValueError(f"ThreadWorld: size must be >= 1, got {size}")
        self.size = size
        self.timeout_s = DEFAULT_TIMEOUT_S if timeout_s is None else float(timeout_s)
        self.cond = threading.Condition()
        self.mailboxes: dict = collections.defaultdict(collections.deque)
        self.log: list = []
        self.aborted: str | None = None

    def transport(self, rank: int) -> "ThreadTransport":
        """The transport of ``rank`` (one per thread)."""
        return ThreadTransport(self, rank)

    def abort(self, why: str) -> None:
        """Wake every waiting receive with a CommError (used when one rank failed)."""
        with self.cond:
            self.aborted = why
            self.cond.notify_all()


class _SendRequest(Request):
    def wait(self, timeout_s: float | None = None) -> None:
        return None

    def test(self) -> bool:
        return True


class _RecvRequest(Request):
    def __init__(self, t: "ThreadTransport", buf: Any, src: int, tag: int) -> None:
        self.t, self.buf, self.src, self.tag = t, buf, src, tag
        self.done = False

    def _take(self) -> bool:
        # Caller holds the condition lock.
        key = (self.src, self.t.rank, self.tag)
        box = self.t.world.mailboxes.get(key)
        if not box:
            return False
        data = box.popleft()
        if not box:  # every call has its own tag: drop empty mailboxes, or they pile up
            del self.t.world.mailboxes[key]
        view = self.buf.reshape(-1).view("u1")
        if len(data) != view.nbytes:
            raise CommError(
                f"[rank {self.t.rank}/{self.t.size}] recv(src={self.src}, tag={self.tag}): got "
                f"{len(data)} bytes but expected {view.nbytes} "
                f"({self.buf.size} x {self.buf.dtype}). "
                "Every rank must pass arrays of the same shape and dtype to a collective.")
        view[:] = np.frombuffer(data, dtype=np.uint8)
        self.done = True
        return True

    def test(self) -> bool:
        if self.done:
            return True
        with self.t.world.cond:
            return self._take()

    def wait(self, timeout_s: float | None = None) -> None:
        if self.done:
            return
        timeout_s = self.t.world.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        world = self.t.world
        # The first wait is short: a side message that came before this wait began notified
        # nobody, and the poll hook after it must see it soon (a peer's failure report).
        nap_s = 0.01
        while True:
            with world.cond:
                if self._take():
                    return
                if world.aborted is not None:
                    raise CommError(f"[rank {self.t.rank}/{self.t.size}] recv(src={self.src}): "
                                    f"the job was aborted: {world.aborted}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CommTimeout(
                        f"[rank {self.t.rank}/{self.t.size}] recv(src={self.src}, tag={self.tag}): "
                        f"no message after {timeout_s:.1f} s. Rank {self.src} is late or stuck; "
                        "check that every rank calls the same collectives in the same order.")
                world.cond.wait(min(left, nap_s))  # every send and side message notifies
                nap_s = 0.5
                if self._take():
                    return
            hook = self.t.poll_hook  # outside the lock: it reads side messages
            if hook is not None:
                error = hook(self.src, self.tag)
                if error is not None:
                    if self.test():  # it arrived after all: a race, not a mismatch
                        return
                    raise error


class ThreadTransport(Transport):
    """One rank's view of a ``ThreadWorld``."""

    name = "threads"
    one_process = True

    def __init__(self, world: ThreadWorld, rank: int) -> None:
        if not 0 <= rank < world.size:
            raise ValueError(f"ThreadTransport: rank {rank} out of range [0, {world.size})")
        self.world, self.rank, self.size = world, rank, world.size
        self.timeout_s = world.timeout_s
        self.messages_sent = 0
        self.bytes_sent = 0
        self.side_channel = ThreadSideChannel(self)  # side.py

    def _check_peer(self, op: str, peer: int) -> None:
        if not 0 <= peer < self.size:
            raise ValueError(f"[rank {self.rank}/{self.size}] {op}: peer {peer} is out of range "
                             f"[0, {self.size}). Pass a rank between 0 and world_size - 1.")

    def isend(self, buf: Any, dst: int, tag: int = 0) -> Request:
        self._check_peer("isend", dst)
        data = buf.reshape(-1).view("u1").tobytes()  # copy: the sender may reuse buf at once
        with self.world.cond:
            self.world.mailboxes[(self.rank, dst, tag)].append(data)
            self.world.log.append((self.rank, dst, tag, len(data)))
            self.world.cond.notify_all()
        self.messages_sent += 1
        self.bytes_sent += len(data)
        self._count_sent(dst, len(data))
        return _SendRequest()

    def irecv(self, buf: Any, src: int, tag: int = 0) -> Request:
        self._check_peer("irecv", src)
        return _RecvRequest(self, buf, src, tag)


# The harness that runs a function on N thread ranks (tests, examples): thread_runner.py.
from minidist.comm.transports.thread_runner import run_threads  # noqa: E402,F401
