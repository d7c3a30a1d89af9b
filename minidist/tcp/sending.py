"""Sending on the TCP mesh: header and payload in one ``sendmsg``, from the caller's thread.

Under a per-peer lock (header and payload never interleave between threads), so ``isend``
completes before it returns. While the peer's socket is full the sender reads every socket
itself (two ranks sending each other big messages never deadlock). ``TCPSending`` is a base
class of ``minidist.tcp.transport.TCPTransport`` and works on its sockets and queues.
"""

from __future__ import annotations

import select
import socket
import time
from typing import Any

from minidist.comm.errors import CommError, CommTimeout
from minidist.comm.transports.base import POLL_S, Request
from minidist.tcp.wire import HEADER, DoneRequest, Inbox, byte_view


class TCPSending:
    """``isend`` of the TCP transport (see the module)."""

    rank: int
    prefix: str
    timeout_s: float
    lock: Any
    _posted: Any
    unexpected: Any
    _socks: Any
    _send_locks: Any
    _progress_lock: Any
    _peers: Any
    _check_peer: Any    # TCPTransport's methods, used here
    _size_error: Any
    _count_sent: Any
    _pump: Any

    def isend(self, buf: Any, dst: int, tag: int = 0) -> Request:
        """Send ``buf`` to ``dst`` now (reading meanwhile: see ``_send``); a done request."""
        view = byte_view(buf, f"isend(dst={dst}, tag={tag})", self.prefix)
        self._check_peer(dst, "isend")
        if dst == self.rank:  # a message to oneself: into the posted recv, else an inbox
            with self.lock:
                posted = self._posted.get((dst, tag))
                req = posted.popleft() if posted else None
                if req is None:
                    inbox = Inbox(len(view))
                    inbox.data[:] = view
                    inbox.done.set()
                    self.unexpected[(dst, tag)].append(inbox)
            if req is not None and len(req.view) != len(view):
                req.fail(self._size_error(dst, tag, len(view), len(req.view)))
            elif req is not None:
                req.view[:] = view
                req.done.set()
            return DoneRequest()
        self._count_sent(dst, len(view))
        try:
            self._send(dst, HEADER.pack(tag, len(view)), view)
        except socket.timeout:
            return DoneRequest(CommTimeout(
                f"{self.prefix} send(dst={dst}, tag={tag}, nbytes={len(view)}): rank {dst} did "
                f"not take the message within {self.timeout_s:g}s. Rank {dst} is stuck or "
                f"overloaded; raise MINIDIST_TIMEOUT_S if it is only slow."))
        except OSError as e:
            return DoneRequest(CommError(
                f"{self.prefix} send(dst={dst}, tag={tag}, nbytes={len(view)}): connection to "
                f"rank {dst} lost ({e.__class__.__name__}: {e}): rank {dst} exited or crashed. "
                f"Look at rank {dst}'s log for the first error."))
        return DoneRequest()

    def _send(self, dst: int, header: bytes, view: memoryview) -> None:
        """Header and payload in one ``sendmsg``; while the peer's socket is full, progress
        the receives (so two ranks sending each other big messages never deadlock).

        Raises:
            socket.timeout: nothing could be sent for ``timeout_s``; OSError: connection lost.
        """
        sock = self._socks[dst]
        total = len(header) + len(view)
        with self._send_locks[dst]:
            try:
                sent = sock.sendmsg([header, view] if len(view) else [header])
            except (BlockingIOError, InterruptedError):
                sent = 0
            if sent == total:
                return
            parts = [memoryview(header), view]
            deadline = time.monotonic() + self.timeout_s
            while sent < total:
                part = parts[0][sent:] if sent < len(header) else view[sent - len(header):]
                try:
                    k = sock.send(part)
                except (BlockingIOError, InterruptedError):
                    k = 0
                if k:
                    sent += k
                    deadline = time.monotonic() + self.timeout_s  # bounded per stall, not total
                    continue
                left = deadline - time.monotonic()
                if left <= 0:
                    raise socket.timeout(f"no progress sending to rank {dst}")
                self._wait_writable(sock, min(left, POLL_S))

    def _wait_writable(self, sock: socket.socket, timeout: float) -> None:
        """Until ``sock`` takes more bytes (or ``timeout``), read whatever arrives meanwhile."""
        if not self._progress_lock.acquire(blocking=False):
            select.select([], [sock], [], timeout)  # another thread progresses the receives
            return
        try:
            poller = select.poll()
            for fd in self._peers:
                poller.register(fd, select.POLLIN)
            poller.register(sock.fileno(), select.POLLIN | select.POLLOUT)
            for fd, events in poller.poll(timeout * 1000.0):
                p = self._peers.get(fd)
                if p is not None and events & ~select.POLLOUT:
                    self._pump(p)
        finally:
            self._progress_lock.release()
