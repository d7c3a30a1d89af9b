"""TCP transport: point-to-point messages over a full mesh of sockets, torchrun-style rendezvous.

    # every rank, started with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the environment
    t = TCPTransport(rank, world_size, "127.0.0.1", 29500)
    ring_all_reduce(t, buf, "sum")           # any algorithm: they only see the Transport
    t.close()

Rendezvous (once, in the constructor)::

    rank 0 listens on MASTER_PORT      every rank listens on its own ephemeral data port
    rank r --(rank, world_size, host, port)--> rank 0     rank 0 checks: same world size,
    rank 0 --(table of all ranks' host:port)--> rank r    ranks 0..N-1 each exactly once
    mesh: rank r connects to every rank below it, accepts every rank above it

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

Safety: strangers cannot join or crash a job. Every connection, to MASTER_PORT or a data port,
opens with a handshake (MAGIC, then an HMAC challenge-response over nonces from both sides,
keyed by ``MINIDIST_AUTH_TOKEN``, empty if unset); a connection that does not complete it within
``HANDSHAKE_S`` (an HTTP request, random bytes, silence) is logged and dropped, and rank 0 goes
on waiting for the real ranks (it serves several connections at once, so one silent client
delays nobody). Ranks with different tokens both fail at once. Every length read
from the wire is checked against a bound (``MAX_JSON_BYTES``, ``MAX_SIDE_BYTES``,
``MINIDIST_TCP_MAX_MESSAGE_BYTES``) before anything is allocated. Rank 0 listens on
``MASTER_ADDR`` only, every other rank on the interface that reaches rank 0
(``MINIDIST_TCP_LISTEN_ADDR=0.0.0.0`` binds all interfaces on purpose); listeners set
``SO_REUSEADDR``, so a job can reuse a port right after the previous one ended. Without a token
the handshake only proves a peer speaks minidist's protocol: on a shared network, set one.

Side channel: the same sockets with negative tags (``-kind``), queued apart from the data;
``side_try_recv``, ``side_pending``, ``peer_lost`` and ``stray_tag`` read what has arrived
first. A receive waiting longer than ``POLL_S`` runs the transport's
``poll_hook`` every ``POLL_S`` (base.py). A lost connection is ``peer_lost(src)``.
"""

from __future__ import annotations

import collections
import errno
import hmac
import json
import os
import secrets
import select
import socket
import struct
import threading
import time
from typing import Any

import numpy as np

from minidist.comm.errors import CommError, CommTimeout
from minidist.comm.transports.base import DEFAULT_TIMEOUT_S, POLL_S, Request, Transport, stream_of
from minidist.envvars import env
from minidist.log import get_logger

log = get_logger(__name__)

_HEADER = struct.Struct("<qQ")  # tag, nbytes
_LEN = struct.Struct("<I")      # length prefix of the JSON rendezvous messages
# Bounds on every length read from the wire, checked before anything is allocated.
MAX_JSON_BYTES = 1 << 20        # a rendezvous message (the address table of ~10^4 ranks)
MAX_SIDE_BYTES = 64 << 20       # a side-channel message (a rank's ledger)


MAX_MESSAGE_BYTES = int(env("MINIDIST_TCP_MAX_MESSAGE_BYTES"))  # default 16 GiB
STAGE_BYTES = 64 << 10          # per-peer staging buffer: one recv gets header and payload
DIRECT_MIN = 16 << 10           # a payload part at least this big goes straight to its buffer
# Handshake on every connection (rendezvous and data), before anything else is read::
#   client -> server   MAGIC, nonce_c
#   server -> client   MAGIC, nonce_s, HMAC(token, "server" nonce_c nonce_s)
#   client -> server   HMAC(token, "client" nonce_s nonce_c)      (sent before checking)
# token = MINIDIST_AUTH_TOKEN (empty if unset). A client that does not open with MAGIC within
# HANDSHAKE_S is dropped with a logged reason; a wrong HMAC ends the rendezvous on both sides.
MAGIC = b"MINIDIST"
NONCE_BYTES = 16
MAC_BYTES = 32                  # HMAC-SHA256


# How long one connection may take to say who it is (raise it on a slow network).
HANDSHAKE_S = float(env("MINIDIST_TCP_HANDSHAKE_S"))


class _Stranger(Exception):
    """A connection that does not speak minidist's protocol: drop it, keep serving."""


def _auth_key() -> bytes:
    return str(env("MINIDIST_AUTH_TOKEN")).encode()


def _mac(key: bytes, role: bytes, a: bytes, b: bytes) -> bytes:
    return hmac.new(key, role + a + b, "sha256").digest()


def _recv_bytes(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    _recv_exact(sock, memoryview(buf))
    return bytes(buf)


# ---------------------------------------------------------------- small socket helpers

def _recv_exact(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view`` from a blocking ``sock`` (handshake, rendezvous); ConnectionError on EOF."""
    got, n = 0, len(view)
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError("connection closed by peer")
        got += k


def _send_json(sock: socket.socket, obj: Any) -> None:
    data = json.dumps(obj).encode()
    sock.sendall(_LEN.pack(len(data)) + data)


def _recv_json(sock: socket.socket) -> Any:
    nbytes = _LEN.unpack(_recv_bytes(sock, _LEN.size))[0]
    if nbytes > MAX_JSON_BYTES:
        raise _Stranger(f"announced a {nbytes}-byte rendezvous message (limit {MAX_JSON_BYTES})")
    try:
        return json.loads(_recv_bytes(sock, nbytes))
    except ValueError as e:  # JSON or UTF-8 errors
        raise _Stranger(f"sent a malformed rendezvous message ({e})") from None


def _byte_view(buf: Any, what: str, prefix: str) -> memoryview:
    """A flat writable byte view of a C-contiguous NumPy array (the TCP wire format)."""
    if not isinstance(buf, np.ndarray):
        raise ValueError(f"{prefix} {what}: the TCP transport moves NumPy host arrays, got "
                         f"{type(buf).__name__}. Copy device arrays to the host first, or use "
                         f"backend='mpi' with a CUDA-aware MPI.")
    if buf.ndim:
        try:
            return memoryview(buf).cast("B")  # C-contiguous only; 2x faster than .view(uint8)
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
    """A ``threading.Event`` for one completion, cheap to create (an Event costs ~10 us here).

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
        self.error: Exception | None = None    # a size mismatch: drained (dest None), then req fails


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
        # Receiving: whichever thread waits progresses every socket (see "Progress" above).
        self._progress_lock = threading.Lock()
        self._peers: dict[int, _Peer] = {}       # fd -> peer, live sockets only
        self._by_rank: dict[int, _Peer] = {}     # rank -> peer
        self._poller = select.poll()
        try:
            table = self._rendezvous()
            self._build_mesh(table)
        except BaseException:
            self.close()
            raise
        for peer, sock in self._socks.items():
            sock.setblocking(False)  # sends and receives never block: they progress instead
            p = _Peer(peer, sock)
            self._peers[p.fd] = p
            self._by_rank[peer] = p
            self._poller.register(p.fd, select.POLLIN)
        log.debug("tcp mesh up: %d peers", len(self._socks))

    # ------------------------------------------------------------ rendezvous and mesh

    def _listen(self, host: str, port: int) -> socket.socket:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # A port left in TIME_WAIT by the previous run on it can be bound again at once.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            s.close()
            if e.errno == errno.EADDRINUSE:
                raise CommError(
                    f"{self.prefix} rendezvous: address already in use: another job is using "
                    f"MASTER_PORT={port} on {host}. Pick another port (MASTER_PORT) or wait for "
                    f"that job to finish.") from e
            raise CommError(f"{self.prefix} rendezvous: cannot listen on {host}:{port} ({e}). "
                            f"Check MASTER_ADDR is an address of this machine.") from e
        s.listen(max(self.size, 8))
        return s

    def _deadline_left(self, deadline: float, what: str) -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise CommTimeout(f"{self.prefix} rendezvous: {what} within {self.timeout_s:g}s "
                              f"(MASTER_ADDR:MASTER_PORT={self.master_addr}:{self.master_port}). "
                              f"Start all {self.size} ranks with the same MASTER_ADDR/PORT, or "
                              f"raise MINIDIST_TIMEOUT_S.")
        return left

    def _connect(self, host: str, port: int, deadline: float, what: str) -> socket.socket:
        """Connect, retrying while the other side is not listening yet."""
        while True:
            left = self._deadline_left(deadline, what)
            try:
                s = socket.create_connection((host, port), timeout=min(left, 5.0))
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return s
            except (ConnectionRefusedError, socket.timeout, OSError):
                time.sleep(min(0.05, max(left, 0)))

    def _listen_host(self, default: str) -> str:
        """Listen only where peers reach us, unless MINIDIST_TCP_LISTEN_ADDR says otherwise."""
        return os.environ.get("MINIDIST_TCP_LISTEN_ADDR") or default

    def _handshake_client(self, sock: socket.socket, who: str) -> None:
        """Prove our token to the server and check its proof (see MAGIC above)."""
        key = _auth_key()
        nonce_c = secrets.token_bytes(NONCE_BYTES)
        try:
            sock.sendall(MAGIC + nonce_c)
            reply = _recv_bytes(sock, len(MAGIC) + NONCE_BYTES + MAC_BYTES)
        except ConnectionError:
            raise CommError(f"{self.prefix} handshake with {who}: the connection was closed "
                            f"before the handshake ended: {who} failed, or the port belongs to "
                            f"another program. Check {who}'s log, or pick another "
                            f"MASTER_PORT.") from None
        except socket.timeout:
            raise CommError(f"{self.prefix} handshake with {who}: it accepted the connection but "
                            f"did not answer minidist's handshake within the socket timeout: "
                            f"another program owns that port (under torchrun its agent's store "
                            f"does; minidist then meets at MASTER_PORT + 1). Pick another "
                            f"MASTER_PORT, or set MINIDIST_RENDEZVOUS_PORT to a free port on "
                            f"every rank.") from None
        if reply[:len(MAGIC)] != MAGIC:
            raise CommError(f"{self.prefix} handshake with {who}: the answer is not minidist's "
                            f"protocol (first bytes {reply[:len(MAGIC)]!r}): another program "
                            f"owns that port. Pick another MASTER_PORT.")
        nonce_s, mac_s = reply[len(MAGIC):-MAC_BYTES], reply[-MAC_BYTES:]
        sock.sendall(_mac(key, b"client", nonce_s, nonce_c))  # before checking: both sides learn
        if not hmac.compare_digest(mac_s, _mac(key, b"server", nonce_c, nonce_s)):
            raise CommError(f"{self.prefix} handshake with {who}: authentication failed: "
                            f"MINIDIST_AUTH_TOKEN differs between this rank and {who} (or is set "
                            f"on only one of them). Set the same token on every rank.")

    def _handshake_server(self, sock: socket.socket, deadline: float) -> None:
        """Check a new connection's proof, within HANDSHAKE_S; raise _Stranger to drop it."""
        sock.settimeout(min(HANDSHAKE_S, self._deadline_left(deadline, "the handshake")))
        key = _auth_key()
        try:
            magic = _recv_bytes(sock, len(MAGIC))
            if magic != MAGIC:
                raise _Stranger(f"did not open with minidist's handshake (first bytes "
                                f"{magic!r})")
            nonce_c = _recv_bytes(sock, NONCE_BYTES)
            nonce_s = secrets.token_bytes(NONCE_BYTES)
            sock.sendall(MAGIC + nonce_s + _mac(key, b"server", nonce_c, nonce_s))
            mac_c = _recv_bytes(sock, MAC_BYTES)
        except socket.timeout:
            raise _Stranger(f"did not complete the handshake within {sock.gettimeout():g}s"
                            ) from None
        except OSError as e:
            raise _Stranger(f"closed the connection during the handshake ({e})") from None
        if not hmac.compare_digest(mac_c, _mac(key, b"client", nonce_s, nonce_c)):
            raise CommError(f"{self.prefix} rendezvous: a peer failed authentication: its "
                            f"MINIDIST_AUTH_TOKEN differs from this rank's (or is set on only "
                            f"one of them). Set the same token on every rank.")

    def _drop(self, where: str, addr: Any, reason: Any) -> None:
        log.warning("%s %s: dropped a connection from %s:%s that is not a rank of this job: %s",
                    self.prefix, where, addr[0] if addr else "?", addr[1] if addr else "?", reason)

    def _rendezvous(self) -> dict[int, tuple[str, int]]:
        """Register with rank 0 and get every rank's (host, data port)."""
        deadline = time.monotonic() + self.timeout_s
        master = None
        if self.rank == 0:
            master = self._listen(self._listen_host(self.master_addr), self.master_port)
            self._listener = self._listen(self._listen_host(self.master_addr), 0)
        try:
            if master is None:
                s = self._connect(self.master_addr, self.master_port, deadline,
                                  "rank 0 did not accept a connection")
                with s:
                    s.settimeout(self._deadline_left(deadline, "no answer from rank 0"))
                    self._handshake_client(s, f"rank 0 at {self.master_addr}:{self.master_port}")
                    # Listen on the interface that reaches rank 0: peers reach us there too.
                    host = s.getsockname()[0]
                    self._listener = self._listen(self._listen_host(host), 0)
                    _send_json(s, {"rank": self.rank, "world_size": self.size,
                                   "host": host, "port": self._listener.getsockname()[1]})
                    try:
                        reply = _recv_json(s)
                    except socket.timeout:
                        raise CommTimeout(
                            f"{self.prefix} rendezvous: registered with rank 0 at "
                            f"{self.master_addr}:{self.master_port} but the address table did "
                            f"not come within {self.timeout_s:g}s: not all {self.size} ranks "
                            f"started. Start every rank (same WORLD_SIZE/MASTER_PORT), or raise "
                            f"MINIDIST_TIMEOUT_S.") from None
                    except (ConnectionError, _Stranger):
                        raise CommError(
                            f"{self.prefix} rendezvous: rank 0 at {self.master_addr}:"
                            f"{self.master_port} closed the connection before sending the address "
                            f"table: rank 0 failed (see its log), or another job owns that "
                            f"port. Check rank 0's error, or pick another MASTER_PORT.") from None
                if "error" in reply:
                    raise CommError(f"{self.prefix} rendezvous: {reply['error']}")
                return {int(r): (h, int(p)) for r, (h, p) in reply["table"].items()}
            return self._serve_rendezvous(master, self._listener.getsockname()[1], deadline)
        finally:
            if master is not None:
                master.close()

    def _registration(self, conn: socket.socket, deadline: float) -> tuple[int, int, str, int]:
        """Handshake, then read one rank's (rank, world_size, host, port); _Stranger if bad."""
        self._handshake_server(conn, deadline)
        try:
            msg = _recv_json(conn)
        except socket.timeout:
            raise _Stranger(f"sent no registration within {conn.gettimeout():g}s") from None
        except OSError as e:
            raise _Stranger(f"closed the connection before registering ({e})") from None
        try:
            r, n, host, port = msg["rank"], msg["world_size"], msg["host"], msg["port"]
            if not (isinstance(r, int) and isinstance(n, int) and isinstance(host, str)
                    and isinstance(port, int)):
                raise TypeError
        except (TypeError, KeyError):
            raise _Stranger(f"sent a registration that is not minidist's: {str(msg)[:80]!r}"
                            ) from None
        return r, n, host, port

    def _accept_ranks(self, listener: socket.socket, handle: Any, deadline: float,
                      what: Any, where: str) -> Any:
        """Accept connections on ``listener``, several at once; yield ``(conn, handle(conn))``.

        Each accepted connection gets a thread of its own that runs ``handle`` (the handshake
        and the first message, bounded by HANDSHAKE_S), so a silent client delays nobody::

            main thread: select(listener, wake) --accept--> thread: handle(conn)
                 ^                                            | result or exception
                 '------- wake byte <-- results queue <-------'

        Strangers (``_Stranger``) are logged and dropped; any other exception of ``handle`` is
        raised here. ``what()`` says who is missing when ``deadline`` passes. Close the
        generator when done: connections still being checked are then logged and shut down.
        """
        results: collections.deque = collections.deque()
        state = threading.Lock()
        open_ = [True]
        pending: dict[socket.socket, Any] = {}  # accepted, still being checked, under state
        wake_r, wake_w = socket.socketpair()

        def check(conn: socket.socket, addr: Any) -> None:
            try:
                out = (conn, addr, handle(conn), None)
            except BaseException as e:  # handed to the main thread
                out = (conn, addr, None, e)
            with state:
                pending.pop(conn, None)
                if open_[0]:
                    results.append(out)
                    try:
                        wake_w.send(b"x")
                    except OSError:
                        pass
                    return
            conn.close()  # the caller has finished: nobody wants this connection any more

        try:
            while True:
                while results:
                    conn, addr, value, error = results.popleft()
                    if isinstance(error, _Stranger):
                        self._drop(where, addr, error)
                        conn.close()
                    elif error is not None:
                        conn.close()
                        raise error
                    else:
                        yield conn, value
                left = self._deadline_left(deadline, what())
                ready, _, _ = select.select([listener, wake_r], [], [], left)
                if wake_r in ready:
                    wake_r.recv(4096)
                if listener in ready:
                    try:
                        conn, addr = listener.accept()
                    except (BlockingIOError, socket.timeout):
                        continue
                    with state:
                        pending[conn] = addr
                    threading.Thread(target=check, args=(conn, addr), daemon=True,
                                     name=f"minidist-tcp-accept-{self.rank}").start()
        finally:
            with state:
                open_[0] = False
                leftover = list(results)
                results.clear()
                silent = list(pending.items())
            for conn, *_ in leftover:
                conn.close()
            for conn, addr in silent:  # its thread closes it once the read fails
                self._drop(where, addr, "was still silent when every rank had arrived")
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            wake_r.close()
            wake_w.close()

    def _serve_rendezvous(self, master: socket.socket, my_port: int,
                          deadline: float) -> dict[int, tuple[str, int]]:
        """Rank 0: collect size-1 registrations, check them, send everyone the table.

        Several connections at once (``_accept_ranks``), each with at most HANDSHAKE_S to prove
        it is a rank: a connection that is not (an HTTP request, random bytes, silence) is
        logged and dropped while the real ranks register.
        """
        table: dict[int, tuple[str, int]] = {0: (self.master_addr, my_port)}
        conns: list[socket.socket] = []

        def missing() -> str:
            return (f"ranks {sorted(set(range(self.size)) - set(table))} did not register "
                    f"with rank 0")

        arrivals = self._accept_ranks(master, lambda c: self._registration(c, deadline),
                                      deadline, missing, "rendezvous")
        try:
            for conn, (r, n, host, port) in (arrivals if self.size > 1 else ()):
                conns.append(conn)
                conn.settimeout(self._deadline_left(deadline, "a rank did not register"))
                error = None
                if n != self.size:
                    error = (f"world size mismatch: rank {r} has WORLD_SIZE={n} but rank 0 has "
                             f"WORLD_SIZE={self.size}. Start every rank with the same WORLD_SIZE.")
                elif not 0 <= r < self.size or r in table:
                    error = (f"rank {r} registered twice or is out of range [0, {self.size - 1}] "
                             f"(already registered: {sorted(table)}). Give every process a "
                             f"distinct RANK in 0..WORLD_SIZE-1.")
                if error is not None:
                    for c in conns:  # tell everyone, so no rank waits for a table that won't come
                        try:
                            _send_json(c, {"error": error})
                        except OSError:
                            pass
                    raise CommError(f"{self.prefix} rendezvous: {error}")
                table[r] = (host, port)
                if len(table) == self.size:
                    break
            for c in conns:
                _send_json(c, {"table": {str(r): list(hp) for r, hp in table.items()}})
            return table
        finally:
            arrivals.close()
            for c in conns:
                c.close()

    def _hello(self, s: socket.socket, deadline: float) -> int:
        """A data connection's handshake and rank; _Stranger unless a higher, new rank."""
        self._handshake_server(s, deadline)
        try:
            peer = _LEN.unpack(_recv_bytes(s, _LEN.size))[0]
        except socket.timeout:
            raise _Stranger("sent no rank after the handshake") from None
        except OSError as e:
            raise _Stranger(f"closed the connection before saying its rank ({e})") from None
        if not self.rank < peer < self.size or peer in self._socks:
            raise _Stranger(f"says it is rank {peer}, but this rank waits for ranks "
                            f"{sorted(set(range(self.rank + 1, self.size)) - set(self._socks))}")
        return peer

    def _build_mesh(self, table: dict[int, tuple[str, int]]) -> None:
        """Connect to every lower rank, accept every higher rank (one socket per pair)."""
        deadline = time.monotonic() + self.timeout_s
        for peer in range(self.rank):
            host, port = table[peer]
            s = self._connect(host, port, deadline, f"could not connect to rank {peer} "
                                                    f"at {host}:{port}")
            try:
                s.settimeout(self._deadline_left(deadline, f"rank {peer} did not answer"))
                self._handshake_client(s, f"rank {peer} at {host}:{port}")
                s.sendall(_LEN.pack(self.rank))
            except BaseException:
                s.close()
                raise
            self._socks[peer] = s
        if len(self._socks) < self.size - 1:
            arrivals = self._accept_ranks(self._listener, lambda c: self._hello(c, deadline),
                                          deadline, lambda: "higher ranks did not connect",
                                          "data port")
            try:
                for s, peer in arrivals:
                    if peer in self._socks:  # two connections claimed the same rank
                        self._drop("data port", s.getpeername(),
                                   f"says it is rank {peer}, which is already connected")
                        s.close()
                        continue
                    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    self._socks[peer] = s
                    if len(self._socks) == self.size - 1:
                        break
            finally:
                arrivals.close()
        self._listener.close()
        # Kernel buffer sizes stay at their (auto-tuned) defaults: 4 MiB SO_SNDBUF/RCVBUF made
        # loopback slower here (1.2 vs 1.75 GB/s one way).

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

    def side_send(self, dst: int, kind: int, payload: bytes) -> None:
        if dst == self.rank or self._closed or dst in self._peer_error:
            return
        try:
            self._send(dst, _HEADER.pack(-kind, len(payload)), memoryview(payload))
        except (OSError, socket.timeout):  # the peer is gone: peer_lost() will say so
            pass

    def side_try_recv(self, src: int, kind: int) -> bytes | None:
        self._poke()
        with self._lock:
            q = self._side.get((src, kind))
            return q.popleft() if q else None

    def side_pending(self, kind: int) -> int | None:
        self._poke()
        with self._lock:
            return next((p for (p, k), q in self._side.items() if k == kind and q), None)

    def stray_tag(self, src: int, tag: int) -> int | None:
        stream = stream_of(tag)
        self._poke()
        with self._lock:
            for (p, t), q in self._unexpected.items():
                if p == src and q and t != tag and stream_of(t) == stream:
                    return t
        return None

    def peer_lost(self, src: int) -> str | None:
        self._poke()
        with self._lock:
            err = self._peer_error.get(src)
        return None if err is None else str(err)

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
        self.count_sent(dst, len(view))
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
        for s in list(self._socks.values()) + [getattr(self, "_listener", None)]:
            if s is None:
                continue
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
            for s in list(self._socks.values()) + [getattr(self, "_listener", None)]:
                if s is not None:
                    s.close()
            for peer in list(self._peers.values()):
                self._forget(peer)
        finally:
            if locked:
                self._progress_lock.release()
