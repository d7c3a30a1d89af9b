"""Rank 0's side of the TCP rendezvous: connections checked side by side, registrations read.

Rank 0 accepts on MASTER_PORT (and every rank on its data port) several connections at once
(``_accept_ranks``), each with at most ``HANDSHAKE_S`` to prove it is a rank, so one silent
client delays nobody. A registration (``_registration``) carries the rank, the world size, its
data address and the job's run id: a rank of another job is refused with one line naming both
ids (``_tell``); a rank late for the rendezvous learns who is in (``_late_registration``).
``_serve_rendezvous`` checks them all and sends every rank the address table.
``RendezvousServer`` is a base class of ``minidist.tcp.rendezvous.Mesh``.
"""

from __future__ import annotations

import collections
import select
import socket
import threading
from typing import Any

from minidist.comm.errors import CommError
from minidist.tcp.handshake import HANDSHAKE_S, peer_address, recv_json, send_json, Stranger

NO_ID = "(none)"  # how a job without a run id is named in messages


class RendezvousServer:
    """Accepting and checking the ranks' connections (see the module)."""

    rank: int
    size: int
    prefix: str
    master_addr: str
    run_id: str
    _taken: dict
    _socks: dict
    master_port: int
    _handshake_server: Any  # MeshHandshake's and Mesh's methods, used here
    _drop: Any
    _deadline_left: Any
    _say_waiting: Any

    def _registration(self, conn: socket.socket, deadline: float) -> tuple[int, int, str, int]:
        """Handshake, then read one rank's (rank, world_size, host, port); Stranger if bad,
        or if it belongs to another job (it is told so first)."""
        until = self._handshake_server(conn, deadline)
        try:
            msg = recv_json(conn, until)
        except socket.timeout:
            raise Stranger(f"sent no registration within {HANDSHAKE_S:g}s of connecting "
                            f"(MINIDIST_TCP_HANDSHAKE_S)") from None
        except OSError as e:
            raise Stranger(f"closed the connection before registering ({e})") from None
        try:
            r, n, host, port = msg["rank"], msg["world_size"], msg["host"], msg["port"]
            theirs = msg.get("run_id", "")
            if not (isinstance(r, int) and isinstance(n, int) and isinstance(host, str)
                    and isinstance(port, int) and isinstance(theirs, str)):
                raise TypeError
        except (TypeError, KeyError, AttributeError):
            raise Stranger(f"sent a registration that is not minidist's: {str(msg)[:80]!r}"
                            ) from None
        if theirs != self.run_id:
            line = (f"rank {r} of job {theirs or NO_ID!r} tried to join job "
                    f"{self.run_id or NO_ID!r} at {self.master_addr}:{self.master_port}; "
                    f"refused. Two jobs share this MASTER_PORT: give each job its own port, "
                    f"and one MINIDIST_RUN_ID (launcher: --rdzv-id) to all ranks of a job.")
            self._tell(conn, line)
            raise Stranger(line)
        return r, n, host, port

    @staticmethod
    def _tell(conn: socket.socket, error: str) -> None:
        """Send a registering rank the reason it is refused (it raises it), if it listens."""
        try:
            conn.settimeout(1.0)
            send_json(conn, {"error": error})
        except OSError:
            pass

    def _late_registration(self, conn: socket.socket, deadline: float) -> None:
        """Rank 0 during the mesh: a rank registers although every slot is taken. Tell it who
        took its slot, log it, drop it (Stranger): the job goes on, or times out naming it."""
        r, n, host, port = self._registration(conn, deadline)
        peer, taken = peer_address(conn), self._taken.get(r)
        line = (f"rank {r} registered from {peer}, but rank {r} of this job "
                f"already registered from {taken}, and the job is building its mesh. If that "
                f"was not your rank {r}, another process took its slot (anyone on this host "
                f"can, without MINIDIST_AUTH_TOKEN): set MINIDIST_AUTH_TOKEN on every rank (the "
                f"launcher sets one), or check that RANK is unique." if taken is not None else
                f"rank {r} (WORLD_SIZE={n}) registered from {peer} after every "
                f"rank 0..{self.size - 1} of this job had registered: it is not a rank of this "
                f"job. Check RANK, WORLD_SIZE and MASTER_PORT.")
        self._tell(conn, line)
        raise Stranger(line)

    def _accept_ranks(self, listeners: dict[socket.socket, tuple[Any, str]], deadline: float,
                      what: Any) -> Any:
        """Accept connections on ``listeners`` (socket -> (handle, where: a name for the
        logs)), several at once; yield ``(conn, handle(conn))``.

        Each accepted connection gets a thread of its own that runs ``handle`` (the handshake
        and the first message, bounded by HANDSHAKE_S), so a silent client delays nobody::

            main thread: select(listener, wake) --accept--> thread: handle(conn)
                 ^                                            | result or exception
                 '------- wake byte <-- results queue <-------'

        Strangers (``Stranger``) are logged and dropped; any other exception of ``handle`` is
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
                    if isinstance(error, Stranger):
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
                if isinstance(error, Stranger):
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
                            send_json(c, {"error": error})
                        except OSError:
                            pass
                    raise CommError(f"{self.prefix} rendezvous: {error}")
                table[r] = (host, port)
                self._taken[r] = peer_address(conn)
                if len(table) == self.size:
                    break
            for c in conns:
                send_json(c, {"table": {str(r): list(hp) for r, hp in table.items()}})
            return table
        finally:
            arrivals.close()
            for c in conns:
                c.close()
