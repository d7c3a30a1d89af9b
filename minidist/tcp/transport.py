"""TCP transport: point-to-point messages over a full mesh of sockets, torchrun-style rendezvous.

    # every rank, started with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the environment
    t = TCPTransport(rank, world_size, "127.0.0.1", 29500)
    ring_all_reduce(t, buf, "sum")           # any algorithm: they only see the Transport
    t.close()

Rendezvous and handshake (once, in the constructor): ``tcp_rendezvous.py`` (``Mesh``) gives
every rank one connected socket per peer.

Wire format on each data socket: a 16-byte header ``(tag: int64, nbytes: uint64)`` then the raw
bytes of the array, sent together by one ``sendmsg`` from a memoryview of the array (no pickle,
no copy, one syscall, TCP_NODELAY on both ends).

Progress: no thread of its own. Whichever thread waits (a ``wait``, or a send that finds the
peer's socket full) reads every socket itself, non-blocking, so the kernel wakes the waiting
thread directly (a reader thread handing each message over cost two wake-ups)::

    wait(req): until req is done:  poll(all peer sockets, POLL_S) -> recv_into(staging buffer)
      header (tag, nbytes) from peer p -> a recv for (p, tag) is posted?
          yes: payload into that array (copied from staging; big parts recv_into it directly)
          no:  into a new bytearray kept as "unexpected"; a later irecv copies it out
    send: sendmsg(header, payload); while the socket is full, progress the receives (so a
          ring of large sendrecv cannot deadlock: each rank drains what it is sent)

Messages of one (peer, tag) stay in order: one socket per peer, read by one thread at a time
(the progress lock); a second waiting thread sleeps on its request until the first one has
filled it, or takes over when the first leaves. Sending happens in the caller's thread under a
per-peer lock (header and payload never interleave between threads); ``isend`` therefore
completes before it returns. A peer's messages are read only while some thread of this rank
waits or sends: a peer sending a large message to a rank that is busy computing waits for it,
as with MPI's rendezvous protocol.

Safety: every connection opened with minidist's handshake (tcp_rendezvous.py), and every
length read from the wire is checked against a bound (``MAX_SIDE_BYTES``,
``MINIDIST_TCP_MAX_MESSAGE_BYTES``) before anything is allocated.

Side channel: the same sockets with negative tags (``-kind``), queued apart from the data;
its ``side_channel`` (``try_recv``, ``pending``, ``peer_lost``, ``stray_tag``) reads what has
arrived first. A receive waiting longer than ``POLL_S`` runs the transport's
``poll_hook`` every ``POLL_S`` (base.py). A lost connection is ``side_channel.peer_lost(src)``.
"""

from __future__ import annotations

import collections
import select
import socket
import struct
import threading
import time
from typing import Any

import numpy as np

from minidist.comm.errors import CommError, CommTimeout
from minidist.comm.transports.base import (DEFAULT_TIMEOUT_S, POLL_S, Request, SideChannel,
                                           Transport, stream_of)
from minidist.tcp.rendezvous import Mesh
from minidist.envvars import env
from minidist.logger import get_logger

log = get_logger(__name__)

_HEADER = struct.Struct("<qQ")  # tag, nbytes
# Bounds on every length read from the wire, checked before anything is allocated.
MAX_SIDE_BYTES = 64 << 20       # a side-channel message (a rank's ledger)


MAX_MESSAGE_BYTES = int(env("MINIDIST_TCP_MAX_MESSAGE_BYTES"))  # default 16 GiB
STAGE_BYTES = 64 << 10          # per-peer staging buffer: one recv gets header and payload
DIRECT_MIN = 16 << 10           # a payload part at least this big goes straight to its buffer


def _byte_view(buf: Any, what: str, prefix: str) -> memoryview:
    """A flat writable byte view of a C-contiguous NumPy array (the TCP wire format)."""
    if not isinstance(buf, np.ndarray):
        raise ValueError(f"{prefix} {what}: the TCP transport moves NumPy host arrays, got "
                         f"{type(buf).__name__}. Copy device arrays to the host first, or use "
                         f"backend='mpi' with a CUDA-aware MPI.")
    if buf.ndim:
        try:
            return memoryview(buf).cast("B")  # C-contiguous only; cheaper than .view(uint8)
        except (TypeError, ValueError):  # not contiguous, or a dtype without a buffer format
            pass
    if not buf.flags.c_contiguous:
        raise ValueError(f"{prefix} {what}: buffer of shape {buf.shape} is not C-contiguous. "
                         f"Pass a contiguous array (np.ascontiguousarray) or a flat bucket.")
    return memoryview(buf.reshape(-1).view(np.uint8))


# ---------------------------------------------------------------- requests

class _DoneRequest(Request):
    """A request that completed (or failed) before it was returned."""

    def __init__(self, error: Exception | None = None) -> None:
        self._error = error

    def wait(self, timeout_s: float | None = None) -> None:
        if self._error is not None:
            raise self._error

    def test(self) -> bool:
        return True


class _Flag:
    """A ``threading.Event`` for one completion, cheap to create (an Event builds a lock and a
    condition: too slow to make per message).

    The thread that progresses the sockets only reads ``flag``; a ``threading.Event`` is made
    only when another thread has to sleep until it is set. Setting ``flag`` before reading
    ``event`` (setter) and publishing ``event`` before reading ``flag`` (sleeper) cannot lose
    a wake-up, and sleepers wake every POLL_S anyway.
    """

    __slots__ = ("flag", "event")

    def __init__(self) -> None:
        self.flag = False
        self.event: threading.Event | None = None

    def is_set(self) -> bool:
        return self.flag

    def set(self) -> None:
        self.flag = True
        event = self.event
        if event is not None:
            event.set()

    def wait(self, timeout: float) -> bool:
        if self.flag:
            return True
        if self.event is None:
            self.event = threading.Event()
            if self.flag:
                return True
        return self.event.wait(timeout)


class _Inbox:
    """A message read (or being read) from a peer before anyone asked for it."""

    def __init__(self, nbytes: int) -> None:
        self.data = bytearray(nbytes)
        self.done = _Flag()
        self.error: Exception | None = None


class _RecvRequest(Request):
    """A posted receive: filled by whichever thread progresses the sockets, or copied from an
    _Inbox that holds the message (or is being filled with it)."""

    def __init__(self, transport: TCPTransport, view: memoryview, src: int, tag: int,
                 inbox: _Inbox | None = None) -> None:
        self.t, self.view, self.src, self.tag, self.inbox = transport, view, src, tag, inbox
        self.done = _Flag()
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


class _Incoming:
    """The message being read from one peer: where its payload goes, and how much came."""

    __slots__ = ("tag", "nbytes", "got", "dest", "req", "inbox", "side", "error")

    def __init__(self, tag: int, nbytes: int, dest: memoryview | None) -> None:
        self.tag, self.nbytes, self.got, self.dest = tag, nbytes, 0, dest
        self.req: _RecvRequest | None = None   # a posted receive, filled in place
        self.inbox: _Inbox | None = None       # nobody asked yet: kept for a later irecv
        self.side: bytearray | None = None     # a side-channel message (tag = -kind)
        self.error: Exception | None = None    # size mismatch: drained (dest None), req fails


class _Peer:
    """One peer's socket and its receive state: a staging buffer and the message in flight."""

    __slots__ = ("rank", "sock", "fd", "stage", "view", "lo", "hi", "msg")

    def __init__(self, rank: int, sock: socket.socket) -> None:
        self.rank, self.sock, self.fd = rank, sock, sock.fileno()
        self.stage = bytearray(STAGE_BYTES)
        self.view = memoryview(self.stage)
        self.lo = self.hi = 0                  # unparsed bytes: stage[lo:hi]
        self.msg: _Incoming | None = None


# ---------------------------------------------------------------- the transport

class _TCPSideChannel(SideChannel):
    """The TCP side channel: frames with a negative kind on the data sockets, queued apart."""

    def __init__(self, t: "TCPTransport") -> None:
        self.t = t

    def send(self, dst: int, kind: int, payload: bytes) -> None:
        t = self.t
        if dst == t.rank or t._closed or dst in t._peer_error:
            return
        try:
            t._send(dst, _HEADER.pack(-kind, len(payload)), memoryview(payload))
        except (OSError, socket.timeout):  # the peer is gone: peer_lost() will say so
            pass

    def try_recv(self, src: int, kind: int) -> bytes | None:
        t = self.t
        t._poke()
        with t._lock:
            q = t._side.get((src, kind))
            return q.popleft() if q else None

    def pending(self, kind: int) -> int | None:
        t = self.t
        t._poke()
        with t._lock:
            return next((p for (p, k), q in t._side.items() if k == kind and q), None)

    def stray_tag(self, src: int, tag: int) -> int | None:
        t = self.t
        stream = stream_of(tag)
        t._poke()
        with t._lock:
            for (p, other), q in t._unexpected.items():
                if p == src and q and other != tag and stream_of(other) == stream:
                    return other
        return None

    def peer_lost(self, src: int) -> str | None:
        t = self.t
        t._poke()
        with t._lock:
            err = t._peer_error.get(src)
        return None if err is None else str(err)


class TCPTransport(Transport):
    """A Transport over TCP sockets (one per peer pair) with MASTER_ADDR/MASTER_PORT rendezvous.

    Args:
        rank: this process's rank, ``0 <= rank < size``.
        size: the world size; every rank must pass the same value.
        master_addr: host where rank 0 listens (``MASTER_ADDR``), e.g. ``"127.0.0.1"``.
        master_port: port where rank 0 listens (``MASTER_PORT``).
        timeout_s: deadline for the rendezvous and for every blocking wait.

    Raises:
        ValueError: rank/size out of range.
        CommError: MASTER_PORT already in use on rank 0, world size mismatch, duplicate rank.
        CommTimeout: rank 0 (or a peer) did not show up within ``timeout_s``.
    """

    name = "tcp"

    def __init__(self, rank: int, size: int, master_addr: str, master_port: int,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.rank, self.size = int(rank), int(size)
        self.prefix = f"[rank {self.rank}/{self.size}]"
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise ValueError(f"{self.prefix} TCPTransport: rank {rank} is not in [0, {size - 1}] "
                             f"(world size {size}). Set RANK to 0..WORLD_SIZE-1 on each process.")
        self.master_addr, self.master_port = master_addr, int(master_port)
        self.timeout_s = float(timeout_s)
        self._closed = False
        self._lock = threading.Lock()  # guards _posted, _unexpected, _peer_error
        self._socks: dict[int, socket.socket] = {}
        self._send_locks = {p: threading.Lock() for p in range(self.size)}
        self._posted: dict[tuple[int, int], collections.deque] = collections.defaultdict(
            collections.deque)
        self._unexpected: dict[tuple[int, int], collections.deque] = collections.defaultdict(
            collections.deque)
        self._peer_error: dict[int, Exception] = {}
        self._side: dict[tuple[int, int], collections.deque] = collections.defaultdict(
            collections.deque)  # (peer, kind) -> payloads, under _lock
        self.side_channel = _TCPSideChannel(self)
        # Receiving: whichever thread waits progresses every socket (see "Progress" above).
        self._progress_lock = threading.Lock()
        self._peers: dict[int, _Peer] = {}       # fd -> peer, live sockets only
        self._by_rank: dict[int, _Peer] = {}     # rank -> peer
        self._poller = select.poll()
        self._socks = Mesh(self.rank, self.size, master_addr, master_port,
                           self.timeout_s).connect()  # rendezvous, handshakes (tcp_rendezvous)
        for peer, sock in self._socks.items():
            sock.setblocking(False)  # sends and receives never block: they progress instead
            p = _Peer(peer, sock)
            self._peers[p.fd] = p
            self._by_rank[peer] = p
            self._poller.register(p.fd, select.POLLIN)
        log.debug("tcp mesh up: %d peers", len(self._socks))

    # ------------------------------------------------------------ receiving

    def _size_error(self, src: int, tag: int, sent: int, expected: int) -> CommError:
        return CommError(f"{self.prefix} recv(src={src}, tag={tag}): rank {src} sent {sent} bytes "
                         f"but this rank expects {expected} bytes. Every rank must pass the same "
                         f"shape and dtype to a collective.")

    def _wait_for(self, event: _Flag, src: int | None, tag: int,
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

    def _pump(self, p: _Peer) -> bool:
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

    def _parse(self, p: _Peer) -> None:
        """Deliver the staged bytes: headers start messages, payload bytes fill them."""
        view = p.view
        while True:
            m = p.msg
            if m is None:
                if p.hi - p.lo < _HEADER.size:
                    return
                tag, nbytes = _HEADER.unpack_from(p.stage, p.lo)
                p.lo += _HEADER.size
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

    def _incoming(self, peer: int, tag: int, nbytes: int) -> _Incoming:
        """A header arrived from ``peer``: decide where its payload goes."""
        limit = MAX_SIDE_BYTES if tag < 0 else MAX_MESSAGE_BYTES
        if nbytes > limit:  # checked before allocating: never trust a length
            raise ConnectionError(
                f"rank {peer} announced a {nbytes}-byte message (tag {tag}), above the limit of "
                f"{limit} bytes (MINIDIST_TCP_MAX_MESSAGE_BYTES): the stream is corrupt")
        if tag < 0:
            side = bytearray(nbytes)
            m = _Incoming(tag, nbytes, memoryview(side))
            m.side = side
            return m
        with self._lock:
            posted = self._posted.get((peer, tag))
            req = posted.popleft() if posted else None
            if posted is not None and not posted:  # every call has its own tag
                del self._posted[(peer, tag)]
            if req is None:
                inbox = _Inbox(nbytes)
                self._unexpected[(peer, tag)].append(inbox)
        if req is None:
            m = _Incoming(tag, nbytes, memoryview(inbox.data))
            m.inbox = inbox
        elif len(req.view) != nbytes:  # drained (never allocated), then the receive fails
            m = _Incoming(tag, nbytes, None)
            m.req, m.error = req, self._size_error(peer, tag, nbytes, len(req.view))
        else:
            m = _Incoming(tag, nbytes, req.view)
            m.req = req
        return m

    def _delivered(self, p: _Peer) -> None:
        m, p.msg = p.msg, None
        if m.side is not None:
            self._side_arrived(p.rank, -m.tag, bytes(m.side))
        elif m.inbox is not None:
            m.inbox.done.set()
        elif m.error is not None:
            m.req.fail(m.error)
        else:
            m.req.done.set()

    def _forget(self, p: _Peer) -> None:
        if self._peers.pop(p.fd, None) is not None:
            try:
                self._poller.unregister(p.fd)
            except (KeyError, ValueError, OSError):
                pass

    def _peer_gone(self, peer: int, cause: Exception, in_flight: _RecvRequest | None) -> None:
        """The socket to ``peer`` ended: fail every recv waiting for it, now and later."""
        what = "this rank closed the transport" if self._closed else (
            f"connection to rank {peer} lost ({cause.__class__.__name__}: {cause}): rank {peer} "
            f"exited or crashed. Look at rank {peer}'s log for the first error")
        error = CommError(f"{self.prefix} recv(src={peer}): {what}.")
        with self._lock:
            error = self._peer_error.setdefault(peer, error)  # the first cause stays
            failed = [r for (p, _), q in self._posted.items() if p == peer for r in q]
            for (p, _), q in self._posted.items():
                if p == peer:
                    q.clear()
            for (p, _), q in self._unexpected.items():
                for inbox in q:
                    if p == peer and not inbox.done.is_set():
                        inbox.error = error
                        inbox.done.set()
        if in_flight is not None and not in_flight.done.is_set():
            failed.append(in_flight)
        for r in failed:
            r.fail(error)

    def irecv(self, buf: Any, src: int, tag: int = 0) -> Request:
        """Post a receive into ``buf`` from ``src``; see the module docstring for the matching."""
        view = _byte_view(buf, f"irecv(src={src}, tag={tag})", self.prefix)
        self._check_peer(src, "irecv")
        with self._lock:
            queue = self._unexpected.get((src, tag))
            if queue:
                inbox = queue.popleft()
                if not queue:  # every call has its own tag: drop empty queues
                    del self._unexpected[(src, tag)]
                return _RecvRequest(self, view, src, tag, inbox=inbox)
            req = _RecvRequest(self, view, src, tag)
            if src in self._peer_error:
                req.fail(self._peer_error[src])
            else:
                self._posted[(src, tag)].append(req)
            return req

    # ------------------------------------------------------------ side channel

    def _side_arrived(self, peer: int, kind: int, payload: bytes) -> None:
        with self._lock:
            self._side[(peer, kind)].append(payload)

    # ------------------------------------------------------------ sending

    def isend(self, buf: Any, dst: int, tag: int = 0) -> Request:
        """Send ``buf`` to ``dst`` now (reading meanwhile: see ``_send``); a done request."""
        view = _byte_view(buf, f"isend(dst={dst}, tag={tag})", self.prefix)
        self._check_peer(dst, "isend")
        if dst == self.rank:  # a message to oneself: into the posted recv, else an inbox
            with self._lock:
                posted = self._posted.get((dst, tag))
                req = posted.popleft() if posted else None
                if req is None:
                    inbox = _Inbox(len(view))
                    inbox.data[:] = view
                    inbox.done.set()
                    self._unexpected[(dst, tag)].append(inbox)
            if req is not None and len(req.view) != len(view):
                req.fail(self._size_error(dst, tag, len(view), len(req.view)))
            elif req is not None:
                req.view[:] = view
                req.done.set()
            return _DoneRequest()
        self._count_sent(dst, len(view))
        try:
            self._send(dst, _HEADER.pack(tag, len(view)), view)
        except socket.timeout:
            return _DoneRequest(CommTimeout(
                f"{self.prefix} send(dst={dst}, tag={tag}, nbytes={len(view)}): rank {dst} did "
                f"not take the message within {self.timeout_s:g}s. Rank {dst} is stuck or "
                f"overloaded; raise MINIDIST_TIMEOUT_S if it is only slow."))
        except OSError as e:
            return _DoneRequest(CommError(
                f"{self.prefix} send(dst={dst}, tag={tag}, nbytes={len(view)}): connection to "
                f"rank {dst} lost ({e.__class__.__name__}: {e}): rank {dst} exited or crashed. "
                f"Look at rank {dst}'s log for the first error."))
        return _DoneRequest()

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

    def _check_peer(self, peer: int, op: str) -> None:
        if self._closed:
            raise CommError(f"{self.prefix} {op}: the TCP transport is closed. Create a new "
                            f"process group after destroy_process_group().")
        if not 0 <= int(peer) < self.size:
            raise ValueError(f"{self.prefix} {op}: peer rank {peer} is not in "
                             f"[0, {self.size - 1}].")

    # ------------------------------------------------------------ teardown

    def close(self) -> None:
        """Shut down the sockets; every receive still waiting fails at once. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for s in self._socks.values():
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for peer in self._socks:  # every receive still waiting fails now
            self._peer_gone(peer, ConnectionError("closed"), in_flight=None)
        # A thread still progressing (woken by the shutdown) lets go of the sockets first; a
        # signal handler that interrupted this very thread inside _progress must not wait.
        locked = self._progress_lock.acquire(timeout=1.0)
        try:
            for s in self._socks.values():
                s.close()
            for peer in list(self._peers.values()):
                self._forget(peer)
        finally:
            if locked:
                self._progress_lock.release()
