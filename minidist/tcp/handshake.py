"""The handshake that opens every TCP connection of a job, and the rendezvous' small messages.

Safety: strangers cannot join or crash a job. Every connection, to MASTER_PORT or a data port,
opens with a handshake (MAGIC, then an HMAC challenge-response over nonces from both sides,
keyed by ``MINIDIST_AUTH_TOKEN``, empty if unset); a connection that does not complete it within
``HANDSHAKE_S`` in all (an HTTP request, random bytes, silence, a byte a second), or answers
with a wrong HMAC (another token, forged or replayed bytes), is a stranger (``Stranger``): one
warning naming its address (``_drop``), and the rank goes on waiting for the real ranks. A rank
started with another token fails at once on its own side (it checks the server's HMAC).

The rendezvous messages are length-prefixed JSON (``send_json``, ``recv_json``), bounded by
``MAX_JSON_BYTES`` before anything is allocated. ``MeshHandshake`` is a base class of
``minidist.tcp.rendezvous.Mesh`` (it reads the Mesh's ``prefix`` and deadline).
"""

from __future__ import annotations

import hmac
import json
import secrets
import socket
import struct
import time
from typing import Any, Callable

from minidist.comm.errors import CommError
from minidist.envvars import env
from minidist.logger import get_logger

log = get_logger("minidist.tcp.transport")  # one logger name for the TCP transport

LENGTH_PREFIX = struct.Struct("<I")      # length prefix of the JSON rendezvous messages
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


class Stranger(Exception):
    """A connection that does not speak minidist's protocol: drop it, keep serving."""


def _auth_key() -> bytes:
    return str(env("MINIDIST_AUTH_TOKEN")).encode()


def handshake_mac(key: bytes, role: bytes, a: bytes, b: bytes) -> bytes:
    return hmac.new(key, role + a + b, "sha256").digest()


def recv_bytes(sock: socket.socket, n: int, until: float | None = None) -> bytes:
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


def send_json(sock: socket.socket, obj: Any) -> None:
    data = json.dumps(obj).encode()
    sock.sendall(LENGTH_PREFIX.pack(len(data)) + data)


def recv_json(sock: socket.socket, until: float | None = None) -> Any:
    nbytes = LENGTH_PREFIX.unpack(recv_bytes(sock, LENGTH_PREFIX.size, until))[0]
    if nbytes > MAX_JSON_BYTES:
        raise Stranger(f"announced a {nbytes}-byte rendezvous message (limit {MAX_JSON_BYTES})")
    try:
        return json.loads(recv_bytes(sock, nbytes, until))
    except ValueError as e:  # JSON or UTF-8 errors
        raise Stranger(f"sent a malformed rendezvous message ({e})") from None


def peer_address(conn: socket.socket) -> str:
    """``host:port`` of the other end of ``conn`` (``?`` once it has gone)."""
    try:
        host, port = conn.getpeername()[:2]
    except OSError:
        return "?"
    return f"{host}:{port}"


class MeshHandshake:
    """Both sides of the handshake, and dropping a stranger (see the module)."""

    prefix: str
    _unauthenticated: set
    _deadline_left: Callable[[float, str], float]  # Mesh's: the time left, or CommTimeout

    def _handshake_client(self, sock: socket.socket, who: str) -> None:
        """Prove our token to the server and check its proof (see MAGIC above)."""
        key = _auth_key()
        nonce_c = secrets.token_bytes(NONCE_BYTES)
        try:
            sock.sendall(MAGIC + nonce_c)
            reply = recv_bytes(sock, len(MAGIC) + NONCE_BYTES + MAC_BYTES)
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
        # before checking: both sides learn
        sock.sendall(handshake_mac(key, b"client", nonce_s, nonce_c))
        if not hmac.compare_digest(mac_s, handshake_mac(key, b"server", nonce_c, nonce_s)):
            raise CommError(f"{self.prefix} handshake with {who}: authentication failed: "
                            f"MINIDIST_AUTH_TOKEN differs between this rank and {who} (or is set "
                            f"on only one of them). Set the same token on every rank.")

    def _handshake_server(self, sock: socket.socket, deadline: float) -> float:
        """Check a new connection's proof; raise Stranger to drop it. The connection has
        HANDSHAKE_S in all, for the handshake and its first message: returns that time limit
        (a ``time.monotonic()`` value) for the caller's read of the first message."""
        limit = min(HANDSHAKE_S, self._deadline_left(deadline, "the handshake"))
        until = time.monotonic() + limit
        key = _auth_key()
        try:
            magic = recv_bytes(sock, len(MAGIC), until)
            if magic != MAGIC:
                raise Stranger(f"did not open with minidist's handshake (first bytes "
                                f"{magic!r})")
            nonce_c = recv_bytes(sock, NONCE_BYTES, until)
            nonce_s = secrets.token_bytes(NONCE_BYTES)
            sock.settimeout(max(until - time.monotonic(), 1e-3))
            sock.sendall(MAGIC + nonce_s + handshake_mac(key, b"server", nonce_c, nonce_s))
            mac_c = recv_bytes(sock, MAC_BYTES, until)
        except socket.timeout:
            raise Stranger(f"did not complete the handshake within {limit:g}s "
                            f"(MINIDIST_TCP_HANDSHAKE_S)") from None
        except OSError as e:
            raise Stranger(f"closed the connection during the handshake ({e})") from None
        if not hmac.compare_digest(mac_c, handshake_mac(key, b"client", nonce_s, nonce_c)):
            # Another token, or forged or replayed bytes (the nonce is fresh): a stranger. A
            # rank with another token fails on its own side, where it checks our HMAC.
            raise Stranger("failed authentication: its HMAC does not match this job's "
                            "MINIDIST_AUTH_TOKEN (another token, or forged or replayed bytes)")
        return until

    def _drop(self, where: str, addr: Any, reason: Any) -> None:
        if str(reason).startswith("failed authentication") and addr:
            self._unauthenticated.add(str(addr[0]))
        log.warning("%s %s: dropped a connection from %s:%s that is not a rank of this job: %s",
                    self.prefix, where, addr[0] if addr else "?", addr[1] if addr else "?", reason)
