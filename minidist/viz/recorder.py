"""Record every message of a collective: who sends which part of the buffer to whom, at which step.

    from minidist.comm.transports.threads import run_threads
    from minidist.comm.algorithms import ring_all_reduce
    from minidist.comm import ReduceOp
    from minidist.viz import Recorder
    rec = Recorder()
    def body(t):
        buf = np.arange(8, dtype=np.float32)
        t = rec.wrap(t, watch=buf)                 # a Transport that records, then delegates
        ring_all_reduce(t, buf, ReduceOp.SUM)
    run_threads(4, body)
    rec.sent_by(0)[0]   # Message(step=0, src=0, dst=1, nbytes=8, start=6, stop=8)
    rec.steps()         # 6 == 2(N-1) for the ring

``RecordingTransport`` is a ``Transport`` like any other: it forwards ``isend``/``irecv`` to the
transport it wraps and writes one ``Message`` per send. It never looks inside that transport.

The step of a message is a logical (Lamport) clock, so it needs no global barrier and shows
what may run at the same time: each rank keeps a counter; a send is stamped with the counter
and bumps it; a completed receive sets it to max(counter, stamp of that message + 1). For the
ring every rank sends once per step, so step s of the picture is step s of the docstring; for a
binomial tree the broadcast's rounds come out one per step, and a rank that is ready early (a
non-power-of-two tree) shows its message at the earliest step its inputs allow. The stamps
travel beside the messages in a FIFO per (src, dst, tag), which matches the transport's
in-order delivery, so the ranks must share one ``Recorder``: threads of one process.

``start``/``stop`` locate the sent bytes inside the watched buffer (in elements), or are None
when the message came from another buffer (a scratch copy).
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass
from typing import Any

from minidist.comm.transports.base import Request, Transport


@dataclass(frozen=True)
class Message:
    """One send: logical step, ranks, size, and the element range of the watched buffer."""

    step: int
    src: int
    dst: int
    nbytes: int
    start: int | None = None
    stop: int | None = None


class Recorder:
    """Shared by the thread ranks of one run; ``wrap`` gives each rank its recording transport."""

    def __init__(self) -> None:
        self.messages: list = []
        self.size = 0
        self.numel = 0  # elements of the watched buffer, for labels (set by render.record)
        self._lock = threading.Lock()
        self._clock: dict = collections.defaultdict(int)
        self._stamps: dict = collections.defaultdict(collections.deque)

    def wrap(self, transport: Transport, watch: Any = None) -> "RecordingTransport":
        """A Transport that records every message ``transport`` carries for this rank.

        Args:
            transport: the rank's transport (any Transport; the threads one for pictures).
            watch: the buffer the collective works on; sends from inside it are located.
        """
        self.size = max(self.size, transport.size)
        return RecordingTransport(transport, self, watch)

    def steps(self) -> int:
        """Number of logical steps: the longest chain of messages that wait on each other."""
        return 1 + max((m.step for m in self.messages), default=-1)

    def sent_by(self, rank: int) -> list:
        """The messages ``rank`` sent, in step order."""
        return sorted((m for m in self.messages if m.src == rank), key=lambda m: m.step)

    def _on_send(self, src: int, dst: int, tag: int, nbytes: int, where: tuple) -> None:
        with self._lock:
            step = self._clock[src]
            self._clock[src] = step + 1
            self._stamps[(src, dst, tag)].append(step)
            self.messages.append(Message(step, src, dst, nbytes, *where))

    def _on_recv(self, src: int, dst: int, tag: int) -> None:
        with self._lock:
            stamp = self._stamps[(src, dst, tag)].popleft()
            self._clock[dst] = max(self._clock[dst], stamp + 1)


def _locate(buf: Any, watch: Any) -> tuple:
    """(start, stop) in elements of ``buf`` inside ``watch``, or (None, None)."""
    if watch is None or buf.size == 0:
        return None, None
    base = watch.__array_interface__["data"][0]
    at = buf.__array_interface__["data"][0]
    if not base <= at < base + watch.nbytes:
        return None, None
    start = (at - base) // watch.itemsize
    return start, start + buf.size


class _RecordedRecv(Request):
    def __init__(self, inner: Request, on_done: Any) -> None:
        self.inner, self.on_done, self.done = inner, on_done, False

    def _finish(self) -> None:
        if not self.done:
            self.done = True
            self.on_done()

    def wait(self, timeout_s: float | None = None) -> None:
        self.inner.wait(timeout_s)
        self._finish()

    def test(self) -> bool:
        if self.inner.test():
            self._finish()
            return True
        return False


class RecordingTransport(Transport):
    """Delegates to ``inner`` and tells the ``Recorder`` about every send and receive."""

    name = "recording"

    def __init__(self, inner: Transport, recorder: Recorder, watch: Any = None) -> None:
        self.inner, self.recorder, self.watch = inner, recorder, watch
        self.rank, self.size = inner.rank, inner.size
        self.timeout_s = inner.timeout_s

    def isend(self, buf: Any, dst: int, tag: int = 0) -> Request:
        # Stamp first: the receiver may complete as soon as the inner send has queued the bytes.
        self.recorder._on_send(self.rank, dst, tag, buf.nbytes, _locate(buf, self.watch))
        return self.inner.isend(buf, dst, tag)

    def irecv(self, buf: Any, src: int, tag: int = 0) -> Request:
        return _RecordedRecv(self.inner.irecv(buf, src, tag),
                             lambda: self.recorder._on_recv(src, self.rank, tag))

    def alloc_buffer(self, numel: int, dtype: Any, xp: Any = None) -> Any:
        return self.inner.alloc_buffer(numel, dtype) if xp is None else \
            self.inner.alloc_buffer(numel, dtype, xp)

    def close(self) -> None:
        self.inner.close()
