"""The Transport: the only thing a collective algorithm sees.

A transport moves bytes of contiguous arrays between ranks ``0..size-1``. Every algorithm in
``minidist.comm.algorithms`` is written against this interface only, so one ring runs over MPI,
TCP sockets, in-process threads (for fast tests) or a single process.

    t.send(buf, dst)                         blocking; returns when buf may be reused
    t.recv(buf, src)                         blocking; fills buf (same numel and dtype as sent)
    t.sendrecv(sendbuf, dst, recvbuf, src)   both at once (never deadlocks in a ring)
    req = t.isend(buf, dst); req.wait()      non-blocking variants; wait(timeout_s) raises
    req = t.irecv(buf, src); req.wait()      CommTimeout naming the peer when it expires

Rules every implementation keeps:
- buffers are C-contiguous arrays (numpy, or cupy where the transport supports device memory);
  a transport never pickles them;
- messages between one (src, dst, tag) pair arrive in the order they were sent;
- ``tag`` separates independent streams (for example a DDP communication thread and the main
  thread's barrier); algorithms pass the tag they were given through unchanged;
- every blocking call honours ``timeout_s`` (default ``MINIDIST_TIMEOUT_S``, 300 s) and raises
  ``CommTimeout`` with the rank, the operation and the peer instead of hanging forever.
"""

from __future__ import annotations

import abc
import os
from typing import Any

import numpy as np

DEFAULT_TIMEOUT_S = float(os.environ.get("MINIDIST_TIMEOUT_S", "300"))


class Request(abc.ABC):
    """Handle of a non-blocking send or receive."""

    @abc.abstractmethod
    def wait(self, timeout_s: float | None = None) -> None:
        """Block until the operation completes; raise CommTimeout after ``timeout_s``."""

    @abc.abstractmethod
    def test(self) -> bool:
        """True once the operation has completed (never blocks)."""


class Transport(abc.ABC):
    """Point-to-point messaging between ``size`` ranks; see the module docstring."""

    rank: int
    size: int
    name: str = "transport"

    @abc.abstractmethod
    def isend(self, buf: Any, dst: int, tag: int = 0) -> Request:
        """Start sending the contiguous array ``buf`` to rank ``dst``."""

    @abc.abstractmethod
    def irecv(self, buf: Any, src: int, tag: int = 0) -> Request:
        """Start receiving into the contiguous array ``buf`` from rank ``src``."""

    def send(self, buf: Any, dst: int, tag: int = 0, timeout_s: float | None = None) -> None:
        """Send ``buf`` to ``dst``; return when ``buf`` may be reused."""
        self.isend(buf, dst, tag).wait(timeout_s)

    def recv(self, buf: Any, src: int, tag: int = 0, timeout_s: float | None = None) -> None:
        """Receive from ``src`` into ``buf``."""
        self.irecv(buf, src, tag).wait(timeout_s)

    def sendrecv(self, sendbuf: Any, dst: int, recvbuf: Any, src: int, tag: int = 0,
                 timeout_s: float | None = None) -> None:
        """Send to ``dst`` and receive from ``src`` at the same time (safe in a ring)."""
        r = self.irecv(recvbuf, src, tag)
        s = self.isend(sendbuf, dst, tag)
        s.wait(timeout_s)
        r.wait(timeout_s)

    def alloc_buffer(self, numel: int, dtype: Any, xp: Any = np) -> Any:
        """Allocate a 1-D communication buffer where this transport moves data best.

        The process group (and DDP's buckets) allocate through here, so a transport may place
        buffers in shared memory or pinned memory. The default is a plain array.
        """
        return xp.empty(int(numel), dtype=dtype)

    def close(self) -> None:
        """Release sockets, windows, threads. Idempotent."""
