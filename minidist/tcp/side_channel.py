"""The TCP side channel: frames with a negative kind (``-kind``) on the data sockets, queued
apart from the data.

Its ``try_recv``, ``pending``, ``peer_lost`` and ``stray_tag`` read what has arrived first (the
watch wing's ledgers travel on it); a lost connection is ``peer_lost(src)``.
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING, Callable

from minidist.comm.transports.base import SideChannel, stream_of
from minidist.tcp.wire import HEADER

if TYPE_CHECKING:
    from minidist.tcp.transport import TCPTransport


class TCPSideChannel(SideChannel):
    """The TCP side channel: frames with a negative kind on the data sockets, queued apart."""

    def __init__(self, t: "TCPTransport", poke: Callable[[], None],
                 send: Callable[[int, bytes, memoryview], None]) -> None:
        self.t = t
        self.poke = poke    # the transport's: read whatever has arrived, without waiting
        self.send_frame = send  # the transport's: one header and payload to a peer

    def send(self, dst: int, kind: int, payload: bytes) -> None:
        t = self.t
        if dst == t.rank or t.closed or dst in t.peer_errors:
            return
        try:
            self.send_frame(dst, HEADER.pack(-kind, len(payload)), memoryview(payload))
        except (OSError, socket.timeout):  # the peer is gone: peer_lost() will say so
            pass

    def try_recv(self, src: int, kind: int) -> bytes | None:
        t = self.t
        self.poke()
        with t.lock:
            q = t.side_queues.get((src, kind))
            return q.popleft() if q else None

    def pending(self, kind: int) -> int | None:
        t = self.t
        self.poke()
        with t.lock:
            return next((p for (p, k), q in t.side_queues.items() if k == kind and q), None)

    def stray_tag(self, src: int, tag: int) -> int | None:
        t = self.t
        stream = stream_of(tag)
        self.poke()
        with t.lock:
            for (p, other), q in t.unexpected.items():
                if p == src and q and other != tag and stream_of(other) == stream:
                    return other
        return None

    def peer_lost(self, src: int) -> str | None:
        t = self.t
        self.poke()
        with t.lock:
            err = t.peer_errors.get(src)
        return None if err is None else str(err)
