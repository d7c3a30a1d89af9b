"""Async collectives: ``Work`` handles and the per-group worker thread that runs them in order.

    work = minidist.all_reduce(buf, async_op=True)   # queued on the group's worker; returns now
    ...                                              # compute while it runs
    work.wait(timeout=5.0)                           # True, or CommTimeout after 5 s
    work.is_completed()                              # True once it finished (ok or failed)

One worker per process group runs the group's async collectives in issue order::

    caller thread                              worker thread (minidist-async-<backend>)
    all_reduce(a, async_op=True) -> Work 1 -->  runs all_reduce(a)   -> Work 1 done
    broadcast(b, async_op=True)  -> Work 2 -->  runs broadcast(b)    -> Work 2 done
    all_reduce(c)  (synchronous): waits until Works 1 and 2 are done (drain), then runs

Every rank therefore makes the group's collectives in the order the program issued them, which
is what the ledger's fingerprints check. A collective keeps its own transport deadline
(``timeout_s`` of the group) whatever ``wait(timeout)`` says: a ``wait`` that gives up raises
``CommTimeout`` but the collective goes on in the background until it completes or fails.
After one async collective fails, the ones queued behind it fail at once (the ranks are out of
step), each saying so.

Transports that are not safe to call from two threads at once (``Transport.thread_safe``
False: MPI without ``MPI_THREAD_MULTIPLE``) complete async collectives eagerly in the caller's
thread instead; their Work is done when the call returns.
"""

from __future__ import annotations

import datetime
import queue
import threading
from typing import Any, Callable

from minidist.comm.errors import CommError, CommTimeout


def _seconds(timeout: float | datetime.timedelta | None, where: str) -> float | None:
    if timeout is None:
        return None
    seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else \
        float(timeout)
    if seconds < 0:
        raise ValueError(f"{where}: timeout={timeout!r} is negative; pass seconds >= 0 or None.")
    return seconds


class Work:
    """The handle an ``async_op=True`` collective returns (torch's ``Work``).

    Args:
        name: the collective (``"all_reduce"``), for messages.
        where: ``"[rank r/N]"`` of the group, for messages.
        result: the output array (``result()`` returns ``[result]``).
        group_timeout_s: the group's transport deadline (named in the timeout message).
    """

    def __init__(self, name: str, where: str, result: Any = None,
                 group_timeout_s: float | None = None) -> None:
        self._name, self._where, self._result = name, where, result
        self._group_timeout_s = group_timeout_s
        self._done = threading.Event()
        self._error: BaseException | None = None

    def _finish(self, error: BaseException | None = None) -> None:
        self._error = error
        self._done.set()

    def wait(self, timeout: float | datetime.timedelta | None = None) -> bool:
        """Block until the collective is done; return True.

        Args:
            timeout: seconds (or a timedelta) to wait at most; None waits until the collective
                completes or fails (its own transport deadline bounds that).

        Raises:
            CommTimeout: not done within ``timeout`` (the collective goes on in the background).
            CommError: the collective failed (the error it raised).
            ValueError: ``timeout`` is negative.
        """
        seconds = _seconds(timeout, f"{self._where} Work.wait({self._name})")
        if not self._done.wait(seconds):
            bound = (f"; the collective itself gives up after the group's timeout of "
                     f"{self._group_timeout_s:g} s" if self._group_timeout_s else "")
            raise CommTimeout(
                f"{self._where} Work.wait({self._name}): not complete after {seconds:g} s. "
                "Some rank of the group has not called this collective yet, or is stuck or "
                "dead: check that every rank of the group issues the same collectives in the "
                "same order (MINIDIST_DEBUG=1 logs each one), or wait longer" + bound + ".")
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        """True once the collective has finished, successfully or not (never blocks)."""
        return self._done.is_set()

    def exception(self) -> BaseException | None:
        """The error the collective raised, or None (also None while it runs)."""
        return self._error

    def result(self) -> list:
        """The output arrays (torch's ``Work.result()``); call after ``wait()``."""
        return [self._result]

    def __repr__(self) -> str:
        state = ("failed" if self._error is not None else "completed") if self._done.is_set() \
            else "pending"
        return f"Work({self._name}, {state})"


def completed(name: str, where: str, result: Any) -> Work:
    """A Work that is already done (eager completion)."""
    work = Work(name, where, result)
    work._finish()
    return work


class AsyncWorker:
    """One daemon thread that runs a group's async collectives in the order they are submitted.

    ``pending`` counts submitted collectives not finished yet; ``drain()`` waits for them
    (a no-op on the worker thread itself, whose collectives call the group's methods).
    """

    def __init__(self, name: str) -> None:
        self.pending = 0
        self.failed: BaseException | None = None
        self._queue: queue.Queue = queue.Queue()
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, work: Work, fn: Callable[[], Any]) -> Work:
        with self._cond:
            self.pending += 1
        self._queue.put((work, fn))
        return work

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            work, fn = item
            try:
                if self.failed is not None:  # the ranks are out of step: do not send more
                    raise CommError(f"{work._where} {work._name} (async): not run, because an "
                                    f"earlier async collective of this group failed: "
                                    f"{self.failed}")
                fn()
                work._finish()
            except BaseException as e:  # handed to whoever waits on the Work
                if self.failed is None:
                    self.failed = e
                work._finish(e)
            finally:
                with self._cond:
                    self.pending -= 1
                    self._cond.notify_all()

    def on_worker(self) -> bool:
        return threading.current_thread() is self._thread

    def drain(self) -> None:
        """Block until every submitted collective has finished (each has its own deadline)."""
        if self.on_worker():
            return
        with self._cond:
            while self.pending:
                self._cond.wait(timeout=1.0)

    def close(self) -> None:
        """Stop the thread once the queue is empty (waits at most 5 s for it)."""
        self._queue.put(None)
        if not self.on_worker():
            self._thread.join(timeout=5.0)
