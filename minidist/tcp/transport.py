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
import threading
from typing import Any

from minidist.comm.errors import CommError
from minidist.comm.transports.base import DEFAULT_TIMEOUT_S, Request, Transport
from minidist.tcp.rendezvous import Mesh
from minidist.tcp.receiving import RecvRequest, TCPReceiving
from minidist.tcp.sending import TCPSending
from minidist.tcp.side_channel import TCPSideChannel
from minidist.tcp.wire import (DIRECT_MIN, MAX_MESSAGE_BYTES, MAX_SIDE_BYTES,  # noqa: F401
                               STAGE_BYTES, Peer, byte_view)
from minidist.logger import get_logger

log = get_logger(__name__)


class TCPTransport(TCPSending, TCPReceiving, Transport):
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

    Attributes its side channel (``side_channel.py``) reads, and ``receiving.py`` fills:
        lock: guards ``unexpected``, ``peer_errors``, ``side_queues`` (and the posted receives).
        closed: True once ``close()`` ran.
        unexpected: (peer, tag) -> the ``Inbox`` of each message that came before its receive.
        peer_errors: peer -> why it can no longer be reached (the first cause).
        side_queues: (peer, kind) -> side-channel payloads that arrived, oldest first.
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
        self.closed = False
        self.lock = threading.Lock()  # guards _posted, unexpected, peer_errors
        self._socks: dict[int, socket.socket] = {}
        self._send_locks = {p: threading.Lock() for p in range(self.size)}
        self._posted: dict[tuple[int, int], collections.deque] = collections.defaultdict(
            collections.deque)
        self.unexpected: dict[tuple[int, int], collections.deque] = collections.defaultdict(
            collections.deque)
        self.peer_errors: dict[int, Exception] = {}
        self.side_queues: dict[tuple[int, int], collections.deque] = collections.defaultdict(
            collections.deque)  # (peer, kind) -> payloads, under lock
        self.side_channel = TCPSideChannel(self, poke=self._poke, send=self._send)
        # Receiving: whichever thread waits progresses every socket (see "Progress" above).
        self._progress_lock = threading.Lock()
        self._peers: dict[int, Peer] = {}        # fd -> peer, live sockets only
        self._by_rank: dict[int, Peer] = {}      # rank -> peer
        self._poller = select.poll()
        self._socks = Mesh(self.rank, self.size, master_addr, master_port,
                           self.timeout_s).connect()  # rendezvous, handshakes (tcp_rendezvous)
        for peer, sock in self._socks.items():
            sock.setblocking(False)  # sends and receives never block: they progress instead
            p = Peer(peer, sock)
            self._peers[p.fd] = p
            self._by_rank[peer] = p
            self._poller.register(p.fd, select.POLLIN)
        log.debug("tcp mesh up: %d peers", len(self._socks))

    def irecv(self, buf: Any, src: int, tag: int = 0) -> Request:
        """Post a receive into ``buf`` from ``src``; see the module docstring for the matching."""
        view = byte_view(buf, f"irecv(src={src}, tag={tag})", self.prefix)
        self._check_peer(src, "irecv")
        with self.lock:
            queue = self.unexpected.get((src, tag))
            if queue:
                inbox = queue.popleft()
                if not queue:  # every call has its own tag: drop empty queues
                    del self.unexpected[(src, tag)]
                return RecvRequest(self, view, src, tag, inbox=inbox)
            req = RecvRequest(self, view, src, tag)
            if src in self.peer_errors:
                req.fail(self.peer_errors[src])
            else:
                self._posted[(src, tag)].append(req)
            return req

    # ------------------------------------------------------------ side channel

    def _check_peer(self, peer: int, op: str) -> None:
        if self.closed:
            raise CommError(f"{self.prefix} {op}: the TCP transport is closed. Create a new "
                            f"process group after destroy_process_group().")
        if not 0 <= int(peer) < self.size:
            raise ValueError(f"{self.prefix} {op}: peer rank {peer} is not in "
                             f"[0, {self.size - 1}].")

    # ------------------------------------------------------------ teardown

    def close(self) -> None:
        """Shut down the sockets; every receive still waiting fails at once. Idempotent."""
        if self.closed:
            return
        self.closed = True
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
