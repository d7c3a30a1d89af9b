"""DDP's communication thread: bucket reductions run in submission order while backward goes on.

    thread = CommThread(reducer._reduce_bucket)   # one per Reducer (overlap=True)
    thread.submit(bucket)                         # in launch order (the same on every rank)
    thread.wait_all()                             # the last hook waits here
    if thread.error: ...                          # (bucket, exception), re-raised by the caller
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable


class CommThread:
    """One daemon thread that runs bucket reductions in the order they are submitted."""

    def __init__(self, work: Callable[[Any], None], device: Any = None) -> None:
        self._work = work
        self._device = device  # CuPy's current device is per thread: use the buffers' one
        self._queue: queue.Queue = queue.Queue()
        self._cond = threading.Condition()
        self._outstanding = 0
        self.error: tuple[Any, BaseException] | None = None
        self._thread = threading.Thread(target=self._run, name="minidist-ddp-comm", daemon=True)
        self._thread.start()

    def submit(self, bucket: Any) -> None:
        with self._cond:
            self._outstanding += 1
        self._queue.put(bucket)

    def _run(self) -> None:
        if self._device is not None:  # pragma: no cover - needs a GPU
            self._device.use()
        while True:
            bucket = self._queue.get()
            if bucket is None:
                return
            try:
                if self.error is None:  # after a failure the collectives are out of step: skip
                    self._work(bucket)
            except BaseException as e:  # kept for the main thread, which re-raises it
                self.error = (bucket, e)
            finally:
                with self._cond:
                    self._outstanding -= 1
                    self._cond.notify_all()

    def wait_all(self) -> None:
        """Block until every submitted bucket is done (each collective has its own deadline)."""
        with self._cond:
            while self._outstanding:
                self._cond.wait(timeout=1.0)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5.0)


__all__ = ["CommThread"]
