"""Receiving on the TCP mesh: whichever thread waits reads every socket itself.

``TCPReceiving`` is a base class of ``minidist.tcp.transport.TCPTransport`` and works on its
sockets and queues (the module docstring there, "Progress", tells how); ``RecvRequest`` is a
posted receive, completed by that progress.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from minidist.comm.errors import CommError, CommTimeout
from minidist.comm.transports.base import POLL_S, Request
from minidist.tcp.wire import (DIRECT_MIN, HEADER, MAX_MESSAGE_BYTES, MAX_SIDE_BYTES, DoneFlag,
                               Inbox, Incoming, Peer)

if TYPE_CHECKING:
    from minidist.tcp.transport import TCPTransport


class RecvRequest(Request):
    """A posted receive: filled by whichever thread progresses the sockets, or copied from an
    Inbox that holds the message (or is being filled with it). Its transport's progress
    (``_poke``, ``_wait_for``) is what completes it."""

    def __init__(self, transport: TCPTransport, view: memoryview, src: int, tag: int,
                 inbox: Inbox | None = None) -> None:
        self.t, self.view, self.src, self.tag, self.inbox = transport, view, src, tag, inbox
        self.done = DoneFlag()
        self.error: Exception | None = None

    def fail(self, error: Exception) -> None:
        self.error = error
        self.done.set()

    def test(self) -> bool:
        event = self.inbox.done if self.inbox is not None else self.done
        if not event.is_set():
            self.t._poke()
        return event.is_set()

    def wait(self, timeout_s: float | None = None) -> None:
        timeout = self.t.timeout_s if timeout_s is None else timeout_s
        event = self.inbox.done if self.inbox is not None else self.done
        if not event.is_set() and not self.t._wait_for(event, self.src, self.tag, timeout):
            raise CommTimeout(
                f"{self.t.prefix} recv(src={self.src}, tag={self.tag}, nbytes={len(self.view)}): "
                f"no message from rank {self.src} after {timeout:g}s. Rank {self.src} is slow, "
                f"stuck in a different collective, or dead; raise MINIDIST_TIMEOUT_S if it is "
                f"only slow.")
        if self.inbox is not None:  # an unexpected message: copy it out once, then forget it
            inbox, self.inbox = self.inbox, None
            if inbox.error is not None:
                self.fail(inbox.error)
            elif len(inbox.data) != len(self.view):
                self.fail(self.t._size_error(self.src, self.tag, len(inbox.data), len(self.view)))
            else:
                self.view[:] = inbox.data
                self.done.set()
        if self.error is not None:
            raise self.error


class TCPReceiving:
    """The receiving half of the TCP transport (see the module)."""

    prefix: str
    poll_hook: Any
    closed: bool
    lock: Any
    unexpected: Any
    peer_errors: Any
    side_queues: Any
    _posted: Any
    _progress_lock: Any
    _peers: Any
    _by_rank: Any
    _poller: Any

    def _size_error(self, src: int, tag: int, sent: int, expected: int) -> CommError:
        """The error of a receive from ``src`` whose message has the wrong size."""
        return CommError(f"{self.prefix} recv(src={src}, tag={tag}): rank {src} sent {sent} bytes "
                         f"but this rank expects {expected} bytes. Every rank must pass the same "
                         f"shape and dtype to a collective.")

    def _wait_for(self, event: DoneFlag, src: int | None, tag: int,
                  timeout: float) -> bool:
        """Progress the sockets until ``event`` is set; False after ``timeout`` s.

        The thread that holds the progress lock reads every socket itself (no hand-off to
        another thread: the kernel wakes the waiting thread directly); another thread waiting at
        the same time sleeps on its event, set by the progressing thread, and takes over when
        that one leaves. The poll hook runs every POLL_S after the first POLL_S.
        """
        now = time.monotonic()
        deadline, next_hook = now + timeout, now + POLL_S
        while not event.is_set():
            if now >= next_hook:
                hook = self.poll_hook
                if hook is not None:
                    error = hook(src, tag)
                    if error is not None and not event.is_set():
                        raise error
                next_hook = now + POLL_S
            if now >= deadline:
                return False
            left = min(next_hook, deadline) - now
            if self._progress_lock.acquire(blocking=False):
                try:
                    first = self._by_rank.get(src) if src is not None else None
                    if first is not None and first.fd in self._peers:
                        self._pump(first)  # usually it is there already: no poll needed
                    while not event.is_set() and self._progress(left):
                        left = 0.0  # read everything that is there, then look at the event
                finally:
                    self._progress_lock.release()
            else:
                event.wait(left)
            now = time.monotonic()
        return True

    def _poke(self) -> None:
        """Read whatever has arrived, without waiting (skipped if another thread is at it)."""
        if self._progress_lock.acquire(blocking=False):
            try:
                while self._progress(0.0):
                    pass
            finally:
                self._progress_lock.release()

    def _progress(self, timeout: float) -> bool:
        """Caller holds the progress lock. Wait up to ``timeout`` s for data on any socket and
        read it; True if anything was read."""
        if not self._peers:
            if timeout > 0:
                time.sleep(min(timeout, POLL_S))
            return False
        got = False
        for fd, _ in self._poller.poll(timeout * 1000.0):  # ms; POLLIN, POLLHUP, POLLERR
            p = self._peers.get(fd)
            if p is not None:
                got = self._pump(p) or got
        return got

    def _pump(self, p: Peer) -> bool:
        """One non-blocking recv from peer ``p``, then deliver every complete piece."""
        m = p.msg
        try:
            if m is not None and p.lo == p.hi and m.dest is not None and \
                    m.nbytes - m.got >= DIRECT_MIN:  # a big payload: straight into its buffer
                k = p.sock.recv_into(m.dest[m.got:], m.nbytes - m.got)
                if k == 0:
                    raise ConnectionError("connection closed by peer")
                m.got += k
                if m.got == m.nbytes:
                    self._delivered(p)
                return True
            if p.lo == p.hi:
                p.lo = p.hi = 0
            elif p.hi == len(p.stage) or p.lo > len(p.stage) // 2:  # make room at the end
                n = p.hi - p.lo
                p.stage[:n] = p.view[p.lo:p.hi]
                p.lo, p.hi = 0, n
            k = p.sock.recv_into(p.view[p.hi:])
            if k == 0:
                raise ConnectionError("connection closed by peer")
            p.hi += k
            self._parse(p)
            return True
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as e:  # ConnectionError, EOF, a corrupt stream, or close()
            self._peer_gone(p.rank, e, in_flight=m.req if m is not None else None)
            self._forget(p)
            return True

    def _parse(self, p: Peer) -> None:
        """Deliver the staged bytes: headers start messages, payload bytes fill them."""
        view = p.view
        while True:
            m = p.msg
            if m is None:
                if p.hi - p.lo < HEADER.size:
                    return
                tag, nbytes = HEADER.unpack_from(p.stage, p.lo)
                p.lo += HEADER.size
                m = p.msg = self._incoming(p.rank, tag, nbytes)
            take = min(m.nbytes - m.got, p.hi - p.lo)
            if take:
                if m.dest is not None:
                    m.dest[m.got:m.got + take] = view[p.lo:p.lo + take]
                p.lo += take
                m.got += take
            if m.got < m.nbytes:
                return
            self._delivered(p)

    def _incoming(self, peer: int, tag: int, nbytes: int) -> Incoming:
        """A header arrived from ``peer``: decide where its payload goes."""
        limit = MAX_SIDE_BYTES if tag < 0 else MAX_MESSAGE_BYTES
        if nbytes > limit:  # checked before allocating: never trust a length
            raise ConnectionError(
                f"rank {peer} announced a {nbytes}-byte message (tag {tag}), above the limit of "
                f"{limit} bytes (MINIDIST_TCP_MAX_MESSAGE_BYTES): the stream is corrupt")
        if tag < 0:
            side = bytearray(nbytes)
            m = Incoming(tag, nbytes, memoryview(side))
            m.side = side
            return m
        with self.lock:
            posted = self._posted.get((peer, tag))
            req = posted.popleft() if posted else None
            if posted is not None and not posted:  # every call has its own tag
                del self._posted[(peer, tag)]
            if req is None:
                inbox = Inbox(nbytes)
                self.unexpected[(peer, tag)].append(inbox)
        if req is None:
            m = Incoming(tag, nbytes, memoryview(inbox.data))
            m.inbox = inbox
        elif len(req.view) != nbytes:  # drained (never allocated), then the receive fails
            m = Incoming(tag, nbytes, None)
            m.req, m.error = req, self._size_error(peer, tag, nbytes, len(req.view))
        else:
            m = Incoming(tag, nbytes, req.view)
            m.req = req
        return m

    def _delivered(self, p: Peer) -> None:
        """Peer ``p``'s message is complete (it has one): hand it to whoever waits for it."""
        m: Incoming
        m, p.msg = p.msg, None  # type: ignore[assignment]
        if m.side is not None:
            self._side_arrived(p.rank, -m.tag, bytes(m.side))
        elif m.inbox is not None:
            m.inbox.done.set()
        elif m.error is not None:
            m.req.fail(m.error)  # type: ignore[union-attr]  # an error comes with its receive
        else:
            m.req.done.set()  # type: ignore[union-attr]  # neither side nor inbox: a receive

    def _forget(self, p: Peer) -> None:
        if self._peers.pop(p.fd, None) is not None:
            try:
                self._poller.unregister(p.fd)
            except (KeyError, ValueError, OSError):
                pass

    def _peer_gone(self, peer: int, cause: Exception, in_flight: RecvRequest | None) -> None:
        """The socket to ``peer`` ended: fail every recv waiting for it, now and later."""
        what = "this rank closed the transport" if self.closed else (
            f"connection to rank {peer} lost ({cause.__class__.__name__}: {cause}): rank {peer} "
            f"exited or crashed. Look at rank {peer}'s log for the first error")
        error = CommError(f"{self.prefix} recv(src={peer}): {what}.")
        with self.lock:
            error = self.peer_errors.setdefault(peer, error)  # the first cause stays
            failed = [r for (p, _), q in self._posted.items() if p == peer for r in q]
            for (p, _), q in self._posted.items():
                if p == peer:
                    q.clear()
            for (p, _), q in self.unexpected.items():
                for inbox in q:
                    if p == peer and not inbox.done.is_set():
                        inbox.error = error
                        inbox.done.set()
        if in_flight is not None and not in_flight.done.is_set():
            failed.append(in_flight)
        for r in failed:
            r.fail(error)

    def _side_arrived(self, peer: int, kind: int, payload: bytes) -> None:
        with self.lock:
            self.side_queues[(peer, kind)].append(payload)
