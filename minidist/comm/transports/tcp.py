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
bytes of the array, sent with ``sendall`` from a memoryview and received with ``recv_into``
straight into the destination array (no pickle, no extra copy when the receive is posted).

Receiving: one thread per peer drains its socket forever, so a sender never waits for the
receiver to post its recv (a ring of large ``sendrecv`` cannot deadlock)::

    header (tag, nbytes) arrives from peer p
      -> a recv for (p, tag) is posted?  yes: recv_into that array (zero copy), mark it done
                                         no:  read into a new bytearray, queue it as
                                              "unexpected"; a later irecv copies it out
Messages of one (peer, tag) stay in order: one socket per peer, one reader per socket.
Sending happens in the caller's thread under a per-peer lock (header and payload never interleave
between threads); ``isend`` therefore completes before it returns.

Safety: strangers cannot join or crash a job. Every connection, to MASTER_PORT or a data port,
opens with a handshake (MAGIC, then an HMAC challenge-response over nonces from both sides,
keyed by ``MINIDIST_AUTH_TOKEN``, empty if unset); a connection that does not complete it within
``HANDSHAKE_S`` (an HTTP request, random bytes, silence) is logged and dropped, and rank 0 goes
on waiting for the real ranks. Ranks with different tokens both fail at once. Every length read
from the wire is checked against a bound (``MAX_JSON_BYTES``, ``MAX_SIDE_BYTES``,
``MINIDIST_TCP_MAX_MESSAGE_BYTES``) before anything is allocated. Rank 0 listens on
``MASTER_ADDR`` only, every other rank on the interface that reaches rank 0
(``MINIDIST_TCP_LISTEN_ADDR=0.0.0.0`` binds all interfaces on purpose); listeners set
``SO_REUSEADDR``, so a job can reuse a port right after the previous one ended. Without a token
the handshake only proves a peer speaks minidist's protocol: on a shared network, set one.

Side channel: the same sockets with negative tags (``-kind``); the reader thread queues side
messages apart from the data. A receive waiting longer than ``POLL_S`` runs the transport's
``poll_hook`` every ``POLL_S`` (base.py). A lost connection is ``peer_lost(src)``.
"""

from __future__ import annotations

import collections
import errno
import hmac
import json
import os
import secrets
import socket
import struct
import threading
import time
from typing import Any

import numpy as np

from minidist.comm.errors import CommError, CommTimeout
from minidist.comm.transports.base import DEFAULT_TIMEOUT_S, POLL_S, Request, Transport, stream_of
from minidist.log import get_logger

log = get_logger(__name__)

_HEADER = struct.Struct("<qQ")  # tag, nbytes
_LEN = struct.Struct("<I")      # length prefix of the JSON rendezvous messages
# Bounds on every length read from the wire, checked before anything is allocated.
MAX_JSON_BYTES = 1 << 20        # a rendezvous message (the address table of ~10^4 ranks)
MAX_SIDE_BYTES = 64 << 20       # a side-channel message (a rank's ledger)


def _env_bytes(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    try:
        return int(raw) if raw else default
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a whole number of bytes; unset it (default "
                         f"{default}) or set one, e.g. {name}={default}.") from None


MAX_MESSAGE_BYTES = _env_bytes("MINIDIST_TCP_MAX_MESSAGE_BYTES", 1 << 34)  # 16 GiB
DRAIN_CHUNK = 1 << 20           # a mis-sized message is drained in chunks of this size
# Handshake on every connection (rendezvous and data), before anything else is read::
#   client -> server   MAGIC, nonce_c
#   server -> client   MAGIC, nonce_s, HMAC(token, "server" nonce_c nonce_s)
#   client -> server   HMAC(token, "client" nonce_s nonce_c)      (sent before checking)
# token = MINIDIST_AUTH_TOKEN (empty if unset). A client that does not open with MAGIC within
# HANDSHAKE_S is dropped with a logged reason; a wrong HMAC ends the rendezvous on both sides.
MAGIC = b"MINIDIST"
NONCE_BYTES = 16
MAC_BYTES = 32                  # HMAC-SHA256
HANDSHAKE_S = 5.0               # how long one connection may take to say who it is


class _Stranger(Exception):
    """A connection that does not speak minidist's protocol: drop it, keep serving."""


def _auth_key() -> bytes:
    return os.environ.get("MINIDIST_AUTH_TOKEN", "").encode()


def _mac(key: bytes, role: bytes, a: bytes, b: bytes) -> bytes:
    return hmac.new(key, role + a + b, "sha256").digest()


def _recv_bytes(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    _recv_exact(sock, memoryview(buf))
    return bytes(buf)


# ---------------------------------------------------------------- small socket helpers

def _recv_exact(sock: socket.socket, view: memoryview, idle_ok: bool = False) -> None:
    """Fill ``view`` from ``sock``; raise ConnectionError on EOF.

    ``idle_ok``: a socket timeout only means "nothing yet" (reader threads wait forever; the
    socket timeout exists to bound ``sendall``), so keep reading.
    """
    got, n = 0, len(view)
    while got < n:
        try:
            k = sock.recv_into(view[got:], n - got)
        except socket.timeout:
            if idle_ok:
                continue
            raise
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


class _Inbox:
    """A message read (or being read) from a peer before anyone asked for it."""

    def __init__(self, nbytes: int) -> None:
        self.data = bytearray(nbytes)
        self.done = threading.Event()
        self.error: Exception | None = None


class _RecvRequest(Request):
    """A posted receive: filled by the peer's reader thread, or copied from an _Inbox."""

    def __init__(self, transport: TCPTransport, view: memoryview, src: int, tag: int,
                 inbox: _Inbox | None = None) -> None:
        self.t, self.view, self.src, self.tag, self.inbox = transport, view, src, tag, inbox
        self.done = threading.Event()
        self.error: Exception | None = None

    def fail(self, error: Exception) -> None:
        self.error = error
        self.done.set()

    def test(self) -> bool:
        return self.done.is_set() or (self.inbox is not None and self.inbox.done.is_set())

    def wait(self, timeout_s: float | None = None) -> None:
        timeout = self.t.timeout_s if timeout_s is None else timeout_s
        event = self.inbox.done if self.inbox is not None else self.done
        if not event.wait(min(POLL_S, timeout)) and not self._wait_polling(event, timeout):
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

    def _wait_polling(self, event: threading.Event, timeout: float) -> bool:
        """Wait for ``event`` up to ``timeout`` s, running the poll hook every POLL_S."""
        deadline = time.monotonic() + timeout
        while True:
            hook = self.t.poll_hook
            if hook is not None:
                error = hook(self.src, self.tag)
                if error is not None and not event.is_set():
                    raise error
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if event.wait(min(POLL_S, left)):
                return True


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
        self._threads: list[threading.Thread] = []
        try:
            table = self._rendezvous()
            self._build_mesh(table)
        except BaseException:
            self.close()
            raise
        for peer, sock in self._socks.items():
            th = threading.Thread(target=self._reader, args=(peer, sock), daemon=True,
                                  name=f"minidist-tcp-recv-{self.rank}<-{peer}")
            th.start()
            self._threads.append(th)
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

    def _serve_rendezvous(self, master: socket.socket, my_port: int,
                          deadline: float) -> dict[int, tuple[str, int]]:
        """Rank 0: collect size-1 registrations, check them, send everyone the table.

        One connection at a time, each with at most HANDSHAKE_S to prove it is a rank: a
        connection that is not (an HTTP request, random bytes, silence) is logged and dropped.
        """
        table: dict[int, tuple[str, int]] = {0: (self.master_addr, my_port)}
        conns: list[socket.socket] = []
        try:
            while len(table) < self.size:
                missing = sorted(set(range(self.size)) - set(table))
                master.settimeout(self._deadline_left(
                    deadline, f"ranks {missing} did not register with rank 0"))
                try:
                    conn, addr = master.accept()
                except socket.timeout:
                    continue  # _deadline_left raises on the next turn
                try:
                    r, n, host, port = self._registration(conn, deadline)
                except _Stranger as e:
                    self._drop("rendezvous", addr, e)
                    conn.close()
                    continue
                except BaseException:
                    conn.close()
                    raise
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
            for c in conns:
                _send_json(c, {"table": {str(r): list(hp) for r, hp in table.items()}})
            return table
        finally:
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
        while len(self._socks) < self.size - 1:
            self._listener.settimeout(self._deadline_left(deadline, "higher ranks did not connect"))
            try:
                s, addr = self._listener.accept()
            except socket.timeout:
                continue
            try:
                peer = self._hello(s, deadline)
            except _Stranger as e:
                self._drop("data port", addr, e)
                s.close()
                continue
            except BaseException:
                s.close()
                raise
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._socks[peer] = s
        self._listener.close()
        for s in self._socks.values():
            # Kernel buffer sizes stay at their (auto-tuned) defaults: 4 MiB SO_SNDBUF/RCVBUF
            # made loopback slower here (1.2 vs 1.75 GB/s one way).
            s.settimeout(self.timeout_s)  # bounds sendall; readers retry; close() wakes them

    # ------------------------------------------------------------ receiving

    def _size_error(self, src: int, tag: int, sent: int, expected: int) -> CommError:
        return CommError(f"{self.prefix} recv(src={src}, tag={tag}): rank {src} sent {sent} bytes "
                         f"but this rank expects {expected} bytes. Every rank must pass the same "
                         f"shape and dtype to a collective.")

    def _reader(self, peer: int, sock: socket.socket) -> None:
        """Per-peer thread: read header, deliver payload to a posted recv or an inbox."""
        header = bytearray(_HEADER.size)
        hview = memoryview(header)
        req: _RecvRequest | None = None
        try:
            while True:
                req = None
                _recv_exact(sock, hview, idle_ok=True)
                tag, nbytes = _HEADER.unpack(header)
                limit = MAX_SIDE_BYTES if tag < 0 else MAX_MESSAGE_BYTES
                if nbytes > limit:  # checked before allocating: never trust a length
                    raise ConnectionError(
                        f"rank {peer} announced a {nbytes}-byte message (tag {tag}), above the "
                        f"limit of {limit} bytes (MINIDIST_TCP_MAX_MESSAGE_BYTES): the stream "
                        f"is corrupt")
                if tag < 0:
                    payload = bytearray(nbytes)
                    _recv_exact(sock, memoryview(payload), idle_ok=True)
                    self._side_arrived(peer, -tag, bytes(payload))
                    continue
                with self._lock:
                    posted = self._posted.get((peer, tag))
                    req = posted.popleft() if posted else None
                    if posted is not None and not posted:  # every call has its own tag
                        del self._posted[(peer, tag)]
                    if req is None:
                        inbox = _Inbox(nbytes)
                        self._unexpected[(peer, tag)].append(inbox)
                if req is None:
                    _recv_exact(sock, memoryview(inbox.data), idle_ok=True)
                    inbox.done.set()
                elif len(req.view) != nbytes:
                    self._drain(sock, nbytes)  # stay in sync, without allocating nbytes
                    req.fail(self._size_error(peer, tag, nbytes, len(req.view)))
                else:
                    _recv_exact(sock, req.view, idle_ok=True)
                    req.done.set()
        except OSError as e:  # ConnectionError, EOF, or shutdown() by close()
            self._peer_gone(peer, e, in_flight=req)

    @staticmethod
    def _drain(sock: socket.socket, nbytes: int) -> None:
        chunk = memoryview(bytearray(min(nbytes, DRAIN_CHUNK)))
        while nbytes > 0:
            k = min(nbytes, len(chunk))
            _recv_exact(sock, chunk[:k], idle_ok=True)
            nbytes -= k

    def _peer_gone(self, peer: int, cause: Exception, in_flight: _RecvRequest | None) -> None:
        """The socket to ``peer`` ended: fail every recv waiting for it, now and later."""
        what = "this rank closed the transport" if self._closed else (
            f"connection to rank {peer} lost ({cause.__class__.__name__}: {cause}): rank {peer} "
            f"exited or crashed. Look at rank {peer}'s log for the first error")
        error = CommError(f"{self.prefix} recv(src={peer}): {what}.")
        with self._lock:
            self._peer_error[peer] = error
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
            with self._send_locks[dst]:
                self._socks[dst].sendall(_HEADER.pack(-kind, len(payload)) + payload)
        except OSError:  # the peer is gone: peer_lost() will say so
            pass

    def side_try_recv(self, src: int, kind: int) -> bytes | None:
        with self._lock:
            q = self._side.get((src, kind))
            return q.popleft() if q else None

    def side_pending(self, kind: int) -> int | None:
        with self._lock:
            return next((p for (p, k), q in self._side.items() if k == kind and q), None)

    def stray_tag(self, src: int, tag: int) -> int | None:
        stream = stream_of(tag)
        with self._lock:
            for (p, t), q in self._unexpected.items():
                if p == src and q and t != tag and stream_of(t) == stream:
                    return t
        return None

    def peer_lost(self, src: int) -> str | None:
        with self._lock:
            err = self._peer_error.get(src)
        return None if err is None else str(err)

    # ------------------------------------------------------------ sending

    def isend(self, buf: Any, dst: int, tag: int = 0) -> Request:
        """Send ``buf`` to ``dst`` now (the peer's reader drains it); returns a done request."""
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
        sock = self._socks[dst]
        self.count_sent(dst, len(view))
        try:
            with self._send_locks[dst]:
                sock.sendall(_HEADER.pack(tag, len(view)))
                if len(view):
                    sock.sendall(view)
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

    def _check_peer(self, peer: int, op: str) -> None:
        if self._closed:
            raise CommError(f"{self.prefix} {op}: the TCP transport is closed. Create a new "
                            f"process group after destroy_process_group().")
        if not 0 <= int(peer) < self.size:
            raise ValueError(f"{self.prefix} {op}: peer rank {peer} is not in "
                             f"[0, {self.size - 1}].")

    # ------------------------------------------------------------ teardown

    def close(self) -> None:
        """Shut down sockets and reader threads. Idempotent."""
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
            s.close()
        for th in self._threads:
            th.join(timeout=2.0)
