"""The side channel: small byte messages beside the data messages, of each transport.

Used only when a collective fails, and at ``destroy_process_group`` (the watch wing's failure
notices and farewells): a few kinds of message that travel apart from the data messages, so
they get through while a collective is stuck::

    side = t.side_channel                    # a SideChannel (one rank: NO_SIDE_CHANNEL)
    side.send(dst, SIDE_FAIL, payload)       # never blocks; a lost peer is ignored
    side.try_recv(src, SIDE_FAIL)            # bytes, or None when nothing arrived yet
    side.pending(SIDE_FAIL)                  # a peer with such a message unread, or None
    side.peer_lost(src)                      # why ``src`` is unreachable, or None
    side.stray_tag(src, tag)                 # a message from src on tag's stream, other tag

Threads: mailboxes keyed ``(src, dst, ("side", kind))`` in the shared world (never counted or
logged), and every send wakes every waiter, which then runs the ``poll_hook``. MPI: a second
duplicate of the communicator (``side``), never blocked behind a stuck call. TCP has its own
(minidist/tcp/transport.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

# Side-channel message kinds.
SIDE_FAIL = 1  # "my collective failed; here is my ledger"
SIDE_BYE = 2   # destroy_process_group: "I am done; here are my collective counts"
SIDE_DONE = 3  # "I have read every ledger" (lets every rank print before the job ends)
SIDE_KINDS = (SIDE_FAIL, SIDE_BYE, SIDE_DONE)


class SideChannel:
    """Small byte messages beside the data messages (see the module docstring). This base is
    the "no side channel" of a one-rank transport: nothing ever arrives; each transport with
    peers has its own (``transport.side_channel``)."""

    def send(self, dst: int, kind: int, payload: bytes) -> None:
        """Queue ``payload`` for rank ``dst``; never blocks, never raises for a lost peer."""
        raise NotImplementedError("this transport has no side channel (one rank, no peers)")

    def try_recv(self, src: int, kind: int) -> bytes | None:
        """The next side message of ``kind`` from ``src``, or None if none arrived yet."""
        return None

    def pending(self, kind: int) -> int | None:
        """A peer whose side message of ``kind`` waits unread, or None (cheap; polled)."""
        return None

    def stray_tag(self, src: int, tag: int) -> int | None:
        """The tag of a data message from ``src`` waiting unmatched on ``tag``'s stream with
        another tag (another call's fingerprint), or None."""
        return None

    def peer_lost(self, src: int) -> str | None:
        """Why rank ``src`` can no longer be reached (connection closed), or None."""
        return None


NO_SIDE_CHANNEL = SideChannel()


class ThreadSideChannel(SideChannel):
    """The threads side channel: mailboxes keyed ('side', kind) in the shared world."""

    def __init__(self, t: Any) -> None:
        self.t = t

    def send(self, dst: int, kind: int, payload: bytes) -> None:
        t = self.t
        if not 0 <= dst < t.size:
            raise ValueError(f"[rank {t.rank}/{t.size}] side_send: peer {dst} is out of range "
                             f"[0, {t.size}). Pass a rank between 0 and world_size - 1.")
        with t.world.cond:
            t.world.mailboxes[(t.rank, dst, ("side", kind))].append(bytes(payload))
            t.world.cond.notify_all()

    def try_recv(self, src: int, kind: int) -> bytes | None:
        t = self.t
        with t.world.cond:
            key = (src, t.rank, ("side", kind))
            box = t.world.mailboxes.get(key)
            if not box:
                return None
            data = box.popleft()
            if not box:
                del t.world.mailboxes[key]
            return data

    def pending(self, kind: int) -> int | None:
        t = self.t
        with t.world.cond:
            boxes = t.world.mailboxes
            return next((src for src in range(t.size)
                         if boxes.get((src, t.rank, ("side", kind)))), None)

    def stray_tag(self, src: int, tag: int) -> int | None:
        from minidist.comm.transports.base import stream_of

        t = self.t
        stream = stream_of(tag)
        with t.world.cond:
            for (s, d, other), box in t.world.mailboxes.items():
                if (s == src and d == t.rank and box and type(other) is int and other != tag
                        and stream_of(other) == stream):
                    return other
        return None


class MPISideChannel(SideChannel):
    """The MPI side channel: messages on a second duplicate communicator (``t.side``)."""

    def __init__(self, t: Any) -> None:
        self.t = t
        self.status = t.MPI.Status()
        self.sends: list = []  # (request, buffer) of side messages in flight

    def send(self, dst: int, kind: int, payload: bytes) -> None:
        t = self.t
        if t.side is None or dst == t.rank:
            return
        buf = np.frombuffer(bytes(payload), np.uint8)
        self.sends = [(r, b) for r, b in self.sends if not r.Test()]
        self.sends.append((t.side.Isend([buf, t.MPI.BYTE], dst, kind), buf))

    def try_recv(self, src: int, kind: int) -> bytes | None:
        from minidist.comm.errors import CommTimeout
        from minidist.comm.transports.base import wait_until

        t = self.t
        if t.side is None:
            return None
        status = t.MPI.Status()
        msg = t.side.Improbe(src, kind, status)
        if msg is None:
            return None
        buf = np.empty(status.Get_count(t.MPI.BYTE), np.uint8)
        req = msg.Irecv([buf, t.MPI.BYTE])

        def timed_out() -> CommTimeout:
            return CommTimeout(f"[rank {t.rank}/{t.size}] side channel: a message from "
                               f"rank {src} did not complete.")
        wait_until(req.Test, min(t.timeout_s, 5.0), timed_out)
        return buf.tobytes()

    def pending(self, kind: int) -> int | None:
        t = self.t
        if t.side is not None and t.side.Iprobe(t.MPI.ANY_SOURCE, kind, self.status):
            return self.status.Get_source()
        return None

    def stray_tag(self, src: int, tag: int) -> int | None:
        from minidist.comm.transports.base import stream_of

        t = self.t
        if t.comm is not None and t.comm.Iprobe(src, t.MPI.ANY_TAG, self.status):
            other = self.status.Get_tag()
            if other != tag and stream_of(other) == stream_of(tag):
                return other
        return None
