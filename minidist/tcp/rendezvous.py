"""TCP rendezvous and handshake: how the ranks of a TCP job find each other and build the mesh.

    socks = Mesh(rank, world_size, "127.0.0.1", 29500, timeout_s).connect()
    # {peer rank: connected socket}: one socket per pair, handshake done (tcp.py uses them)

Rendezvous (once, when the TCP transport is made)::

    rank 0 listens on MASTER_PORT      every rank listens on its own ephemeral data port
    rank r --(rank, world_size, host, port)--> rank 0     rank 0 checks: same world size,
    rank 0 --(table of all ranks' host:port)--> rank r    ranks 0..N-1 each exactly once
    mesh: rank r connects to every rank below it, accepts every rank above it

The handshake every connection opens with, and the limits on what is read, are in
``handshake.py``; rank 0's serving of registrations (and every rank's accepting of
connections) in ``rendezvous_server.py``.

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

import errno
import os
import select
import socket
import time
from typing import Any

from minidist.comm import waits
from minidist.comm.errors import CommError, CommTimeout
from minidist.envvars import env
from minidist.logger import get_logger
from minidist.tcp.handshake import (HANDSHAKE_S, LENGTH_PREFIX, MAC_BYTES,  # noqa: F401
                                    MAGIC, MAX_JSON_BYTES, NONCE_BYTES, MeshHandshake, Stranger,
                                    handshake_mac, recv_bytes, recv_json, send_json)
from minidist.tcp.rendezvous_server import NO_ID, RendezvousServer  # noqa: F401

log = get_logger("minidist.tcp.transport")  # one logger name for the TCP transport


def run_id() -> str:
    """This job's identity in the rendezvous: MINIDIST_RUN_ID, else torchrun's run id, else ""."""
    mine = str(env("MINIDIST_RUN_ID") or "")
    if not mine:
        mine = os.environ.get("TORCHELASTIC_RUN_ID", "")
        mine = "" if mine == "none" else mine  # torchrun's default when --rdzv-id is not given
    return mine


class Mesh(MeshHandshake, RendezvousServer):
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
                send_json(s, {"rank": self.rank, "world_size": self.size,
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
                    reply = recv_json(s)
                except socket.timeout:
                    raise CommTimeout(
                        f"{self.prefix} rendezvous: registered with rank 0 at "
                        f"{self.master_addr}:{self.master_port} but the address table did "
                        f"not come within {self.timeout_s:g}s: not all {self.size} ranks "
                        f"started. Start every rank (same WORLD_SIZE/MASTER_PORT), or raise "
                        f"MINIDIST_TIMEOUT_S.") from None
                except (ConnectionError, Stranger):
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

    def _hello(self, s: socket.socket, deadline: float) -> int:
        """A data connection's handshake and rank; Stranger unless a higher, new rank."""
        until = self._handshake_server(s, deadline)
        try:
            peer = LENGTH_PREFIX.unpack(recv_bytes(s, LENGTH_PREFIX.size, until))[0]
        except socket.timeout:
            raise Stranger("sent no rank after the handshake") from None
        except OSError as e:
            raise Stranger(f"closed the connection before saying its rank ({e})") from None
        if not self.rank < peer < self.size or peer in self._socks:
            raise Stranger(f"says it is rank {peer}, but this rank waits for ranks "
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
                s.sendall(LENGTH_PREFIX.pack(self.rank))
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
