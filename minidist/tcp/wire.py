"""The TCP transport's messages: the wire format, the bounds on it, and the receive state.

Wire format on each data socket: a 16-byte header ``(tag: int64, nbytes: uint64)`` (``HEADER``)
then the raw bytes of the array. Every length read from the wire is checked against a bound
(``MAX_SIDE_BYTES``, ``MINIDIST_TCP_MAX_MESSAGE_BYTES``) before anything is allocated.

A receive is a ``transport.RecvRequest`` (posted) or an ``Inbox`` (arrived before its receive
was posted), each completed through a ``DoneFlag``; ``Peer`` is one peer's socket with its staging
buffer and the message in flight (``Incoming``). ``minidist.tcp.transport`` moves them.
"""

from __future__ import annotations

import socket
import struct
import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from minidist.comm.transports.base import Request
from minidist.envvars import env

if TYPE_CHECKING:
    from minidist.tcp.receiving import RecvRequest

HEADER = struct.Struct("<qQ")  # tag, nbytes
# Bounds on every length read from the wire, checked before anything is allocated.
MAX_SIDE_BYTES = 64 << 20       # a side-channel message (a rank's ledger)


MAX_MESSAGE_BYTES = int(env("MINIDIST_TCP_MAX_MESSAGE_BYTES"))  # default 16 GiB
STAGE_BYTES = 64 << 10          # per-peer staging buffer: one recv gets header and payload
DIRECT_MIN = 16 << 10           # a payload part at least this big goes straight to its buffer


def byte_view(buf: Any, what: str, prefix: str) -> memoryview:
    """A flat writable byte view of a C-contiguous NumPy array (the TCP wire format)."""
    if not isinstance(buf, np.ndarray):
        raise ValueError(f"{prefix} {what}: the TCP transport moves NumPy host arrays, got "
                         f"{type(buf).__name__}. Copy device arrays to the host first, or use "
                         f"backend='mpi' with a CUDA-aware MPI.")
    if buf.ndim:
        try:
            return memoryview(buf).cast("B")  # type: ignore[arg-type]  # C-contiguous only
        except (TypeError, ValueError):  # not contiguous, or a dtype without a buffer format
            pass
    if not buf.flags.c_contiguous:
        raise ValueError(f"{prefix} {what}: buffer of shape {buf.shape} is not C-contiguous. "
                         f"Pass a contiguous array (np.ascontiguousarray) or a flat bucket.")
    return memoryview(buf.reshape(-1).view(np.uint8))  # type: ignore[arg-type]


# ---------------------------------------------------------------- requests

class DoneRequest(Request):
    """A request that completed (or failed) before it was returned."""

    def __init__(self, error: Exception | None = None) -> None:
        self._error = error

    def wait(self, timeout_s: float | None = None) -> None:
        if self._error is not None:
            raise self._error

    def test(self) -> bool:
        return True


class DoneFlag:
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


class Inbox:
    """A message read (or being read) from a peer before anyone asked for it."""

    def __init__(self, nbytes: int) -> None:
        self.data = bytearray(nbytes)
        self.done = DoneFlag()
        self.error: Exception | None = None


class Incoming:
    """The message being read from one peer: where its payload goes, and how much came."""

    __slots__ = ("tag", "nbytes", "got", "dest", "req", "inbox", "side", "error")

    def __init__(self, tag: int, nbytes: int, dest: memoryview | None) -> None:
        self.tag, self.nbytes, self.got, self.dest = tag, nbytes, 0, dest
        self.req: RecvRequest | None = None   # a posted receive, filled in place
        self.inbox: Inbox | None = None       # nobody asked yet: kept for a later irecv
        self.side: bytearray | None = None     # a side-channel message (tag = -kind)
        self.error: Exception | None = None    # size mismatch: drained (dest None), req fails


class Peer:
    """One peer's socket and its receive state: a staging buffer and the message in flight."""

    __slots__ = ("rank", "sock", "fd", "stage", "view", "lo", "hi", "msg")

    def __init__(self, rank: int, sock: socket.socket) -> None:
        self.rank, self.sock, self.fd = rank, sock, sock.fileno()
        self.stage = bytearray(STAGE_BYTES)
        self.view = memoryview(self.stage)
        self.lo = self.hi = 0                  # unparsed bytes: stage[lo:hi]
        self.msg: Incoming | None = None


# ---------------------------------------------------------------- the transport
