"""TCP rendezvous and handshake: how the ranks of a TCP job find each other and build the mesh.

    socks = Mesh(rank, world_size, "127.0.0.1", 29500, timeout_s).connect()
    # {peer rank: connected socket}: one socket per pair, handshake done (tcp.py uses them)

Rendezvous (once, when the TCP transport is made)::

    rank 0 listens on MASTER_PORT      every rank listens on its own ephemeral data port
    rank r --(rank, world_size, host, port)--> rank 0     rank 0 checks: same world size,
    rank 0 --(table of all ranks' host:port)--> rank r    ranks 0..N-1 each exactly once
    mesh: rank r connects to every rank below it, accepts every rank above it

Safety: strangers cannot join or crash a job. Every connection, to MASTER_PORT or a data port,
opens with a handshake (MAGIC, then an HMAC challenge-response over nonces from both sides,
keyed by ``MINIDIST_AUTH_TOKEN``, empty if unset); a connection that does not complete it within
``HANDSHAKE_S`` in all (an HTTP request, random bytes, silence, a byte a second), or answers
with a wrong HMAC (another token, forged or replayed bytes), is a stranger: one warning naming
its address, and the rank goes on waiting for the real ranks (it serves several connections at
once, so one silent client delays nobody). A rank started with another token fails at once on
its own side (it checks the server's HMAC). Every length read from the wire is checked against
a bound (``MAX_JSON_BYTES`` here; transport.py bounds the data messages) before anything is
allocated.

Job identity: each registration carries the job's run id (``MINIDIST_RUN_ID``; the launcher's
``--rdzv-id``, torchrun's ``TORCHELASTIC_RUN_ID``). Rank 0 refuses a rank of another job with one
line naming both ids (the refused rank raises it), so two jobs on one port never swap ranks. Rank 0
keeps MASTER_PORT open until the mesh is built: a rank that registers for a slot already taken
learns at once who took it, and rank 0 logs the conflict. Rank 0 listens on ``MASTER_ADDR`` only,
every other rank on the interface that reaches rank 0 (``MINIDIST_TCP_LISTEN_ADDR=0.0.0.0`` binds
all interfaces on purpose); listeners set ``SO_REUSEADDR``, so a job can reuse a port right after
the previous one ended. Without a token the handshake only proves a peer speaks minidist's protocol:
on a shared network, set one.
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

from minidist.comm import waits
from minidist.comm.errors import CommError, CommTimeout
from minidist.envvars import env
from minidist.logger import get_logger

log = get_logger("minidist.tcp.transport")  # one logger name for the TCP transport

_LEN = struct.Struct("<I")      # length prefix of the JSON rendezvous messages
MAX_JSON_BYTES = 1 << 20        # a rendezvous message (the address table of ~10^4 ranks)
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
NO_ID = "(none)"  # how a job without a run id is named in messages


class _Stranger(Exception):
    """A connection that does not speak minidist's protocol: drop it, keep serving."""


def _auth_key() -> bytes:
    return str(env("MINIDIST_AUTH_TOKEN")).encode()


def run_id() -> str:
    """This job's identity in the rendezvous: MINIDIST_RUN_ID, else torchrun's run id, else ""."""
    mine = str(env("MINIDIST_RUN_ID") or "")
    if not mine:
        mine = os.environ.get("TORCHELASTIC_RUN_ID", "")
        mine = "" if mine == "none" else mine  # torchrun's default when --rdzv-id is not given
    return mine


def _mac(key: bytes, role: bytes, a: bytes, b: bytes) -> bytes:
    return hmac.new(key, role + a + b, "sha256").digest()


def _recv_bytes(sock: socket.socket, n: int, until: float | None = None) -> bytes:
    buf = bytearray(n)
    _recv_exact(sock, memoryview(buf), until)
    return bytes(buf)


# ---------------------------------------------------------------- small socket helpers

def _recv_exact(sock: socket.socket, view: memoryview, until: float | None = None) -> None:
    """Fill ``view`` from a blocking ``sock`` (handshake, rendezvous); ConnectionError on EOF.
    ``until`` (time.monotonic()): socket.timeout once it passes, however the bytes trickle in."""
    got, n = 0, len(view)
    while got < n:
        if until is not None:
            left = until - time.monotonic()
            if left <= 0:
                raise socket.timeout("time is up")
            sock.settimeout(left)
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError("connection closed by peer")
        got += k


def _send_json(sock: socket.socket, obj: Any) -> None:
    data = json.dumps(obj).encode()
    sock.sendall(_LEN.pack(len(data)) + data)


def _recv_json(sock: socket.socket, until: float | None = None) -> Any:
    nbytes = _LEN.unpack(_recv_bytes(sock, _LEN.size, until))[0]
    if nbytes > MAX_JSON_BYTES:
        raise _Stranger(f"announced a {nbytes}-byte rendezvous message (limit {MAX_JSON_BYTES})")
    try:
        return json.loads(_recv_bytes(sock, nbytes, until))
    except ValueError as e:  # JSON or UTF-8 errors
        raise _Stranger(f"sent a malformed rendezvous message ({e})") from None


def _address(conn: socket.socket) -> str:
    """``host:port`` of the other end of ``conn`` (``?`` once it has gone)."""
    try:
        host, port = conn.getpeername()[:2]
    except OSError:
        return "?"
    return f"{host}:{port}"


class Mesh:
    """One rank's part of the rendezvous and the mesh (see the module docstring).

    Args:
        rank, size: this rank and the world size (checked by the caller).
        master_addr, master_port: where rank 0 listens (``MASTER_ADDR``, ``MASTER_PORT``).
        timeout_s: deadline for the rendezvous, and again for building the mesh.
    """

    def __init__(self, rank: int, size: int, master_addr: str, master_port: int,
                 timeout_s: float) -> None:
        self.rank, self.size = rank, size
        self.prefix = f"[rank {rank}/{size}]"
        self.master_addr, self.master_port = master_addr, int(master_port)
        self.timeout_s = float(timeout_s)
        self._started, self._said_waiting = time.monotonic(), False  # see _say_waiting
        self._socks: dict[int, socket.socket] = {}
        self._listener: Any = None  # my data port
        self._master: Any = None    # rank 0: MASTER_PORT, open until the mesh is built
        self.run_id = run_id()
        self._taken: dict[int, str] = {}  # rank 0: rank -> address it registered from
        self._unauthenticated: set[str] = set()  # hosts whose connections failed the HMAC

    def connect(self) -> dict[int, socket.socket]:
        """Rendezvous, then connect to every peer: ``{peer: socket}`` (blocking sockets).

        Raises:
            CommError: MASTER_PORT in use, world size mismatch, duplicate rank, bad token.
            CommTimeout: rank 0 (or a peer) did not show up within ``timeout_s``.
        """
        try:
            self._build_mesh(self._rendezvous())
        except BaseException:
            for s in [*self._socks.values(), self._listener]:
                if s is not None:
                    s.close()
            raise
        finally:
            if self._master is not None:
                self._master.close()
        return self._socks

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
            hosts = ", ".join(sorted(self._unauthenticated))
            token = (f" Connections from {hosts} failed authentication: if ranks run there, "
                     f"their MINIDIST_AUTH_TOKEN differs from this rank's." if hosts else "")
            raise CommTimeout(f"{self.prefix} rendezvous: {what} within {self.timeout_s:g}s "
                              f"(MASTER_ADDR:MASTER_PORT={self.master_addr}:{self.master_port}). "
                              f"Start all {self.size} ranks with the same MASTER_ADDR/PORT, or "
                              f"raise MINIDIST_TIMEOUT_S.{token}")
        return left

    def _connect(self, host: str, port: int, deadline: float, what: str) -> socket.socket:
        """Connect, retrying while the other side is not listening yet."""
        started = time.monotonic()
        while True:
            left = self._deadline_left(deadline, what)
            self._say_waiting(deadline, left, lambda: f"{host}:{port} to accept a connection "
                              f"({what} yet)", started)
            try:
                s = socket.create_connection((host, port), timeout=min(left, 5.0))
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return s
            except (ConnectionRefusedError, socket.timeout, OSError):
                time.sleep(min(0.05, max(left, 0)))

    def _say_waiting(self, deadline: float, left: float, who: Any,
                     started: float | None = None) -> float:
        """Once, after the failure policy's wait_notice_s: log who this rank waits for and how
        long it may; returns how long the caller may block before it should call again."""
        started = self._started if started is None else started
        waited = time.monotonic() - started
        notice = waits.NOTICE  # a long rendezvous says whom it waits for (the watch wing's)
        if self._said_waiting or notice is None or notice[0] <= 0:
            return left
        after_s, text = notice
        if waited < after_s:
            return min(left, after_s - waited + 0.01)
        self._said_waiting = True
        log.warning("%s", text("rendezvous", waited, who(), float(self.timeout_s)))
        return left

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

    def _handshake_server(self, sock: socket.socket, deadline: float) -> float:
        """Check a new connection's proof; raise _Stranger to drop it. The connection has
        HANDSHAKE_S in all, for the handshake and its first message: returns that time limit
        (a ``time.monotonic()`` value) for the caller's read of the first message."""
        limit = min(HANDSHAKE_S, self._deadline_left(deadline, "the handshake"))
        until = time.monotonic() + limit
        key = _auth_key()
        try:
            magic = _recv_bytes(sock, len(MAGIC), until)
            if magic != MAGIC:
                raise _Stranger(f"did not open with minidist's handshake (first bytes "
                                f"{magic!r})")
            nonce_c = _recv_bytes(sock, NONCE_BYTES, until)
            nonce_s = secrets.token_bytes(NONCE_BYTES)
            sock.settimeout(max(until - time.monotonic(), 1e-3))
            sock.sendall(MAGIC + nonce_s + _mac(key, b"server", nonce_c, nonce_s))
            mac_c = _recv_bytes(sock, MAC_BYTES, until)
        except socket.timeout:
            raise _Stranger(f"did not complete the handshake within {limit:g}s "
                            f"(MINIDIST_TCP_HANDSHAKE_S)") from None
        except OSError as e:
            raise _Stranger(f"closed the connection during the handshake ({e})") from None
        if not hmac.compare_digest(mac_c, _mac(key, b"client", nonce_s, nonce_c)):
            # Another token, or forged or replayed bytes (the nonce is fresh): a stranger. A
            # rank with another token fails on its own side, where it checks our HMAC.
            raise _Stranger("failed authentication: its HMAC does not match this job's "
                            "MINIDIST_AUTH_TOKEN (another token, or forged or replayed bytes)")
        return until

    def _drop(self, where: str, addr: Any, reason: Any) -> None:
        if str(reason).startswith("failed authentication") and addr:
            self._unauthenticated.add(str(addr[0]))
        log.warning("%s %s: dropped a connection from %s:%s that is not a rank of this job: %s",
                    self.prefix, where, addr[0] if addr else "?", addr[1] if addr else "?", reason)

    def _rendezvous(self) -> dict[int, tuple[str, int]]:
        """Register with rank 0 and get every rank's (host, data port)."""
        deadline = time.monotonic() + self.timeout_s
        if self.rank == 0:
            self._master = self._listen(self._listen_host(self.master_addr), self.master_port)
            self._listener = self._listen(self._listen_host(self.master_addr), 0)
            if not self.run_id and self.size > 1:
                log.warning("%s rendezvous: this job has no identity (MINIDIST_RUN_ID unset): "
                            "a rank of another job started on MASTER_PORT=%s could join it; "
                            "set the same MINIDIST_RUN_ID on every rank, or start them with "
                            "python -m minidist.launch", self.prefix, self.master_port)
        if self._master is None:
            s = self._connect(self.master_addr, self.master_port, deadline,
                              "rank 0 did not accept a connection")
            with s:
                s.settimeout(self._deadline_left(deadline, "no answer from rank 0"))
                self._handshake_client(s, f"rank 0 at {self.master_addr}:{self.master_port}")
                # Listen on the interface that reaches rank 0: peers reach us there too.
                host = s.getsockname()[0]
                self._listener = self._listen(self._listen_host(host), 0)
                _send_json(s, {"rank": self.rank, "world_size": self.size,
                               "host": host, "port": self._listener.getsockname()[1],
                               "run_id": self.run_id})
                waited = time.monotonic()
                while not select.select([s], [], [], self._say_waiting(
                        deadline, self._deadline_left(
                            deadline, "registered with rank 0, but its address table (sent "
                            "once every rank has registered) did not come"),
                        lambda: "rank 0's address table (it waits until every rank has "
                                "registered)", waited))[0]:
                    pass
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
        return self._serve_rendezvous(self._master, self._listener.getsockname()[1],
                                      deadline)

    def _registration(self, conn: socket.socket, deadline: float) -> tuple[int, int, str, int]:
        """Handshake, then read one rank's (rank, world_size, host, port); _Stranger if bad,
        or if it belongs to another job (it is told so first)."""
        until = self._handshake_server(conn, deadline)
        try:
            msg = _recv_json(conn, until)
        except socket.timeout:
            raise _Stranger(f"sent no registration within {HANDSHAKE_S:g}s of connecting "
                            f"(MINIDIST_TCP_HANDSHAKE_S)") from None
        except OSError as e:
            raise _Stranger(f"closed the connection before registering ({e})") from None
        try:
            r, n, host, port = msg["rank"], msg["world_size"], msg["host"], msg["port"]
            theirs = msg.get("run_id", "")
            if not (isinstance(r, int) and isinstance(n, int) and isinstance(host, str)
                    and isinstance(port, int) and isinstance(theirs, str)):
                raise TypeError
        except (TypeError, KeyError, AttributeError):
            raise _Stranger(f"sent a registration that is not minidist's: {str(msg)[:80]!r}"
                            ) from None
        if theirs != self.run_id:
            line = (f"rank {r} of job {theirs or NO_ID!r} tried to join job "
                    f"{self.run_id or NO_ID!r} at {self.master_addr}:{self.master_port}; "
                    f"refused. Two jobs share this MASTER_PORT: give each job its own port, "
                    f"and one MINIDIST_RUN_ID (launcher: --rdzv-id) to all ranks of a job.")
            self._tell(conn, line)
            raise _Stranger(line)
        return r, n, host, port

    @staticmethod
    def _tell(conn: socket.socket, error: str) -> None:
        """Send a registering rank the reason it is refused (it raises it), if it listens."""
        try:
            conn.settimeout(1.0)
            _send_json(conn, {"error": error})
        except OSError:
            pass

    def _late_registration(self, conn: socket.socket, deadline: float) -> None:
        """Rank 0 during the mesh: a rank registers although every slot is taken. Tell it who
        took its slot, log it, drop it (_Stranger): the job goes on, or times out naming it."""
        r, n, host, port = self._registration(conn, deadline)
        peer, taken = _address(conn), self._taken.get(r)
        line = (f"rank {r} registered from {peer}, but rank {r} of this job "
                f"already registered from {taken}, and the job is building its mesh. If that "
                f"was not your rank {r}, another process took its slot (anyone on this host "
                f"can, without MINIDIST_AUTH_TOKEN): set MINIDIST_AUTH_TOKEN on every rank (the "
                f"launcher sets one), or check that RANK is unique." if taken is not None else
                f"rank {r} (WORLD_SIZE={n}) registered from {peer} after every "
                f"rank 0..{self.size - 1} of this job had registered: it is not a rank of this "
                f"job. Check RANK, WORLD_SIZE and MASTER_PORT.")
        self._tell(conn, line)
        raise _Stranger(line)

    def _accept_ranks(self, listeners: dict[socket.socket, tuple[Any, str]], deadline: float,
                      what: Any) -> Any:
        """Accept connections on ``listeners`` (socket -> (handle, where: a name for the
        logs)), several at once; yield ``(conn, handle(conn))``.

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

        def check(conn: socket.socket, addr: Any, handle: Any, where: str) -> None:
            out: tuple[Any, ...]
            try:
                out = (conn, addr, where, handle(conn), None)
            except BaseException as e:  # handed to the main thread
                out = (conn, addr, where, None, e)
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
                    conn, addr, where, value, error = results.popleft()
                    if isinstance(error, _Stranger):
                        self._drop(where, addr, error)
                        conn.close()
                    elif error is not None:
                        conn.close()
                        raise error
                    else:
                        yield conn, value
                left = self._deadline_left(deadline, what())
                left = self._say_waiting(deadline, left, lambda: f"the other ranks ({what()} yet)")
                ready, _, _ = select.select([*listeners, wake_r], [], [], left)
                if wake_r in ready:
                    wake_r.recv(4096)
                for listener in ready:
                    if listener is wake_r:
                        continue
                    try:
                        conn, addr = listener.accept()
                    except (BlockingIOError, socket.timeout):
                        continue
                    with state:
                        pending[conn] = (addr, listeners[listener][1])
                    threading.Thread(target=check, args=(conn, addr, *listeners[listener]),
                                     daemon=True, name=f"minidist-tcp-accept-{self.rank}").start()
        finally:
            with state:
                open_[0] = False
                leftover = list(results)
                results.clear()
                silent = list(pending.items())
            for conn, addr, where, _, error in leftover:  # checked after every rank arrived
                if isinstance(error, _Stranger):
                    self._drop(where, addr, error)
                conn.close()
            for conn, (addr, where) in silent:  # its thread closes it once the read fails
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

        arrivals = self._accept_ranks(
            {master: (lambda c: self._registration(c, deadline), "rendezvous")}, deadline,
            missing)
        try:
            for conn, (r, n, host, port) in (arrivals if self.size > 1 else ()):
                conns.append(conn)
                conn.settimeout(self._deadline_left(deadline, "a rank did not register"))
                error = None
                if n != self.size:
                    error = (f"world size mismatch: rank {r} has WORLD_SIZE={n} but rank 0 has "
                             f"WORLD_SIZE={self.size}. Start every rank with the same WORLD_SIZE.")
                elif not 0 <= r < self.size or r in table:
                    first = f"; rank {r} from {self._taken[r]}" if r in self._taken else ""
                    error = (f"rank {r} registered twice or is out of range [0, {self.size - 1}] "
                             f"(already registered: {sorted(table)}{first}). Give every process "
                             f"a distinct RANK in 0..WORLD_SIZE-1.")
                if error is not None:
                    for c in conns:  # tell everyone, so no rank waits for a table that won't come
                        try:
                            _send_json(c, {"error": error})
                        except OSError:
                            pass
                    raise CommError(f"{self.prefix} rendezvous: {error}")
                table[r] = (host, port)
                self._taken[r] = _address(conn)
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
        until = self._handshake_server(s, deadline)
        try:
            peer = _LEN.unpack(_recv_bytes(s, _LEN.size, until))[0]
        except socket.timeout:
            raise _Stranger("sent no rank after the handshake") from None
        except OSError as e:
            raise _Stranger(f"closed the connection before saying its rank ({e})") from None
        if not self.rank < peer < self.size or peer in self._socks:
            raise _Stranger(f"says it is rank {peer}, but this rank waits for ranks "
                            f"{sorted(set(range(self.rank + 1, self.size)) - set(self._socks))}")
        return peer

    def _mesh_missing(self) -> str:
        """Who has not connected to this rank's data port yet, and from where it registered."""
        late = sorted(set(range(self.rank + 1, self.size)) - set(self._socks))
        where = ", ".join(f"rank {r} registered from {self._taken[r]}" for r in late
                          if r in self._taken)
        return (f"higher ranks {late} did not connect"
                + (f" ({where}; if that was not your rank, set MINIDIST_AUTH_TOKEN)"
                   if where else ""))

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
            listeners: dict[socket.socket, tuple[Any, str]] = {
                self._listener: (lambda c: self._hello(c, deadline), "data port")}
            if self._master is not None:  # a rank late for the rendezvous learns who is in
                listeners[self._master] = (lambda c: self._late_registration(c, deadline),
                                           "rendezvous")
            arrivals = self._accept_ranks(listeners, deadline, self._mesh_missing)
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
        # Kernel buffer sizes stay at their (auto-tuned) defaults: fixed 4 MiB SO_SNDBUF/RCVBUF
        # made loopback slower, not faster (benchmarks/allreduce.py --backend tcp shows it).


__all__ = ["Mesh", "HANDSHAKE_S", "MAGIC", "NONCE_BYTES", "MAC_BYTES", "MAX_JSON_BYTES"]
