"""The single-process transport: ``size == 1``, so every collective is a no-op or a copy.

    t = LocalTransport()
    ring_all_reduce(t, buf, ReduceOp.SUM)   # returns at once: one rank already holds the sum

Used when a script runs without a launcher (``python train.py``), so the same training code
works on one process. Point-to-point calls have no peer and raise a clear error.
"""

from __future__ import annotations

from typing import Any

from minidist.comm.transports.base import DEFAULT_TIMEOUT_S, Request, Transport


class LocalTransport(Transport):
    """A world of one rank. ``send``/``recv`` raise ValueError (there is nobody to talk to)."""

    name = "local"
    one_process = True

    def __init__(self, timeout_s: float | None = None) -> None:
        self.rank = 0
        self.size = 1
        self.timeout_s = DEFAULT_TIMEOUT_S if timeout_s is None else float(timeout_s)

    def _no_peer(self, op: str, peer: int) -> ValueError:
        return ValueError(f"[rank 0/1] {op}(peer={peer}): the local transport has a single rank, "
                          "so there is no peer to talk to. Launch several ranks with mpiexec or "
                          "torchrun to use point-to-point messages.")

    def isend(self, buf: Any, dst: int, tag: int = 0) -> Request:
        raise self._no_peer("isend", dst)

    def irecv(self, buf: Any, src: int, tag: int = 0) -> Request:
        raise self._no_peer("irecv", src)
