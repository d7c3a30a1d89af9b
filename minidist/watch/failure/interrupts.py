"""One rank's failure ends the world; so does Ctrl-C, promptly and in one line.

    from minidist.watch.failure import interrupts
    interrupts.install(group)      # init_process_group does this
    interrupts.uninstall()         # destroy_process_group does this

- An uncaught exception (main thread or any other): the traceback, prefixed ``[rank r/N]``,
  then ``transport.abort(1)`` (MPI Abort ends every rank) or ``transport.close()`` (TCP peers
  see the closed connection).
- Ctrl-C (SIGINT; mpiexec forwards it to every rank): one line ``[rank 0/N] interrupted
  (SIGINT): ...``, no traceback, then ``transport.abort(130)``: every rank ends and mpiexec
  exits with 130 (over TCP: ``os._exit(130)``; MPI_Finalize and atexit handlers would wait for
  peers that are gone). Ranks other than 0 wait ``INTERRUPT_QUIET_S`` first, so rank 0's abort
  usually ends them before they print. A rank whose main thread is inside a blocking MPI call
  cannot run Python's handler; a watcher thread (woken through ``signal.set_wakeup_fd``) ends
  it after ``INTERRUPT_GRACE_S``::

      SIGINT --> C handler --+--> main thread in Python: KeyboardInterrupt -> sys_hook --.
                             '--> wakeup fd -> watcher: Python saw it within 1 s? no ----+
                                                                                         v
                                             "[rank r/N] interrupted ..."; abort(130)

The watcher is also the backstop when Python did take the interrupt: a rank still alive
``INTERRUPT_UNWIND_S`` later (stuck on its way out) is ended the same way.

The Ctrl-C part applies at world size > 1, when SIGINT still has Python's default handler and
no wakeup fd is set (asyncio), and in the main thread; otherwise Python's behaviour stays.
``uninstall`` restores everything.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any, Callable

from minidist import logger as mdlog
from minidist.watch.failure import report
from minidist.comm.advice import failure_peers
from minidist.watch.failure import notice
from minidist.watch.failure.policy import FailurePolicy

INTERRUPT_EXIT_CODE = FailurePolicy.interrupt_exit_code  # 128 + SIGINT, as a shell says
# A rank whose main thread waits inside a blocking MPI call (Barrier, Comm_split_type, MPI's
# Allreduce) runs no Python code, so Python's SIGINT handler cannot raise KeyboardInterrupt
# there. The watcher thread gives the main thread this long to take the interrupt itself.
INTERRUPT_GRACE_S = FailurePolicy.interrupt_grace_s
# Python took the interrupt but the rank is still alive this long after: something on the way
# out (a handler, a ``finally``, a thread the exit waits for) is stuck. The watcher ends it, so
# Ctrl-C always ends every rank in bounded time.
INTERRUPT_UNWIND_S = FailurePolicy.interrupt_unwind_s
# Ranks other than 0 wait this long before ending: rank 0's exit usually makes the launcher end
# them first, so a Ctrl-C prints one line, not one per rank. Longer than INTERRUPT_GRACE_S so
# rank 0, even in a blocking call, gets there first.
INTERRUPT_QUIET_S = FailurePolicy.interrupt_quiet_s
# Before MPI Abort: time for the launcher to relay this rank's last lines (an "interrupted"
# line, a traceback); Abort kills the job at once, and Hydra drops output still in flight.
ABORT_FLUSH_S = 0.2

_saved_hooks: tuple | None = None  # (sys.excepthook, threading.excepthook) before install
_restore_signals: Callable[[], None] | None = None  # undoes _watch_sigint
_ending: _Ending | None = None  # this process's, from prepare() until uninstall()


class _Ending:
    """How this rank ends: the first path that ends the process wins; others go quiet.

    Made by ``prepare`` before the transport exists (Ctrl-C during the rendezvous or MPI's
    start-up), given the transport by ``install`` once the group is up.
    """

    def __init__(self, rank: int, size: int) -> None:
        self.rank, self.size = rank, size
        self.transport: Any = None  # None until the group exists: nothing to abort yet
        self.policy = FailurePolicy()  # the group's, once there is one
        self.lock = threading.Lock()

    def interrupted(self) -> None:
        """Ctrl-C: one line, then abort(130) (MPI: every rank) or exit (TCP and others)."""
        code = self.policy.interrupt_exit_code
        if not self.lock.acquire(blocking=False):
            time.sleep(self.policy.interrupt_quiet_s)  # another thread is ending this process
            os._exit(code)
        _flush_std_streams()
        if notice.tell("interrupted", "interrupted (SIGINT)", code=code):
            os._exit(code)  # the launcher prints the job's one line
        transport = self.transport
        aborts = transport is not None and transport.abort_ends_job
        if self.rank != 0 and aborts:
            time.sleep(self.policy.interrupt_quiet_s)  # rank 0's abort normally ends us first
        sys.stderr.write(f"{mdlog.rank_prefix()} interrupted (SIGINT): ending the job on all "
                         f"{self.size} ranks with exit code {code}.\n")
        sys.stderr.flush()
        if aborts:
            # MPI Abort ends every rank, even those inside a blocking call, and mpiexec exits
            # with our code. The launcher relays our stderr through a pipe, and the abort can
            # tear that down before it has read the line above: give it a moment. MPI prints
            # its own "application called MPI_Abort" line; ours already says it, so stderr goes
            # quiet first.
            time.sleep(ABORT_FLUSH_S)
            os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
            transport.abort(code)
        os._exit(code)  # TCP and others: peers see the closed connections

    def failed(self, exc_type: Any, exc: Any, tb: Any, where: str) -> None:
        """An uncaught exception: the rank-prefixed traceback, then abort(1)."""
        if not self.lock.acquire(blocking=False):
            return  # the process is already ending (Ctrl-C, or another thread's failure)
        # Under the launcher: say it first, so the launcher can stop the ranks that would only
        # report this rank's closed connection (and stop this one, if a peer failed first).
        notice.tell("exception", notice.exception_line(exc_type, exc), failure_peers(exc),
                    getattr(exc, "exit_code", None) or 1)
        report.write_block(report.uncaught_block(exc_type, exc, tb, mdlog.rank_prefix(), where,
                                                 self.size))
        transport = self.transport
        if transport is None:
            return  # no group yet: Python ends the process as usual
        if transport.abort_ends_job:
            time.sleep(ABORT_FLUSH_S)  # let the launcher relay the traceback first
            os.dup2(os.open(os.devnull, os.O_WRONLY), 2)  # MPI's own abort line repeats ours
        # MPI: takes every rank down (does not return); TCP and others close, so peers see
        # the closed connection. A rank that left (PeerExited) gives the job its exit code.
        code = getattr(exc, "exit_code", None)
        transport.abort(code or 1)
        if code:  # TCP and others return from abort: end with the job's code, not Python's 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)


def _flush_std_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def caused_by_interrupt(exc: Any) -> bool:
    """KeyboardInterrupt itself, or an error raised while one was being handled."""
    seen = 0
    while exc is not None and seen < 32:
        if isinstance(exc, KeyboardInterrupt):
            return True
        exc, seen = exc.__context__, seen + 1
    return False


def _hooks(ending: _Ending, prev_sys: Any, prev_thread: Any) -> tuple:
    """``(sys.excepthook, threading.excepthook)`` that end the world (one rank: the old ones)."""

    def sys_hook(exc_type: Any, exc: Any, tb: Any) -> None:
        if ending.size == 1 or not ending.policy.end_job_on_error:
            prev_sys(exc_type, exc, tb)
            return
        if caused_by_interrupt(exc):
            ending.interrupted()
        ending.failed(exc_type, exc, tb, "in the main thread")

    def thread_hook(args: Any) -> None:
        if args.exc_type is SystemExit or ending.size == 1 or not ending.policy.end_job_on_error:
            prev_thread(args)
            return
        ending.failed(args.exc_type, args.exc_value, args.exc_traceback,
                      f"in thread {getattr(args.thread, 'name', '?')}")

    return sys_hook, thread_hook


def prepare(rank: int, size: int) -> None:
    """Before the transport exists: make Ctrl-C during the rendezvous (or MPI's start-up) end
    this rank in one line, exit code 130 (``init_process_group`` calls this first)."""
    global _saved_hooks, _restore_signals, _ending
    if _saved_hooks is None:
        _saved_hooks = (sys.excepthook, threading.excepthook)
    _ending = _Ending(rank, size)
    sys.excepthook, threading.excepthook = _hooks(_ending, *_saved_hooks)
    if (size > 1 and _restore_signals is None
            and threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) in (signal.default_int_handler, signal.SIG_IGN)):
        # SIG_IGN: a rank started with `&` from a script inherits an ignored SIGINT; left so,
        # it would outlive the Ctrl-C that ends the rest of its job by MINIDIST_TIMEOUT_S.
        _restore_signals = _watch_sigint(_ending.interrupted, signal.getsignal(signal.SIGINT))


def install(group: Any) -> None:
    """Install the exception hooks and (world size > 1) the SIGINT watcher for ``group``."""
    if _ending is None:
        prepare(group.rank, group.size)
    assert _ending is not None
    _ending.rank, _ending.size = group.rank, group.size  # MPI may say more than the launcher
    _ending.transport, _ending.policy = group.transport, group.failure_policy
    if group.size > 1 and _restore_signals is None:
        prepare(group.rank, group.size)  # prepare saw one rank (PMIx: the size comes from MPI)
        _ending.transport, _ending.policy = group.transport, group.failure_policy


def interrupted_during_start(exc: BaseException) -> None:
    """``init_process_group`` failed while starting: a Ctrl-C ends the rank in one line."""
    if _ending is not None and _ending.size > 1 and caused_by_interrupt(exc):
        _ending.interrupted()


def uninstall() -> None:
    """Restore the hooks and SIGINT handling that ``install`` replaced. Idempotent."""
    global _saved_hooks, _restore_signals, _ending
    if _saved_hooks is not None:
        sys.excepthook, threading.excepthook = _saved_hooks
        _saved_hooks = None
    if _restore_signals is not None:
        _restore_signals()
        _restore_signals = None
    _ending = None


def _watch_sigint(end: Callable[[], None], previous: Any) -> Callable[[], None] | None:
    """Route SIGINT through a wakeup pipe to a watcher thread; return the undo function."""
    rfd, wfd = os.pipe()
    os.set_blocking(wfd, False)  # set_wakeup_fd's requirement: the C handler must never block
    old_fd = signal.set_wakeup_fd(wfd, warn_on_full_buffer=False)
    if old_fd != -1:  # somebody (asyncio) already listens: leave SIGINT to them
        signal.set_wakeup_fd(old_fd)
        os.close(rfd)
        os.close(wfd)
        return None
    python_saw = threading.Event()  # Python's handler ran (the main thread is in Python)
    stopped = threading.Event()  # set by restore(): the group is gone, the watcher stands down

    def on_sigint(signum: int, frame: Any) -> None:
        python_saw.set()
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    threading.Thread(target=_watch, args=(rfd, python_saw, stopped, end),
                     name="minidist-sigint-watcher", daemon=True).start()

    def restore() -> None:
        stopped.set()
        signal.signal(signal.SIGINT, previous)
        signal.set_wakeup_fd(-1)
        os.write(wfd, b"\0")
        os.close(wfd)
    return restore


def _watch(rfd: int, python_saw: threading.Event, stopped: threading.Event,
           end: Callable[[], None]) -> None:
    """The watcher thread: read signal numbers from the wakeup pipe; end a stuck rank."""
    while True:
        try:
            got = os.read(rfd, 64)
        except OSError:
            return
        if not got or 0 in got:  # 0: destroy_process_group asked the watcher to stop
            os.close(rfd)
            return
        if signal.SIGINT in got:
            policy = _ending.policy if _ending is not None else FailurePolicy()
            if not python_saw.wait(policy.interrupt_grace_s):
                end()  # the main thread is stuck in C: end from here
            python_saw.clear()  # Python raised KeyboardInterrupt; the next Ctrl-C is new
            if not stopped.wait(policy.interrupt_unwind_s):  # normally the rank has ended
                end()  # still here, group not destroyed: stuck on the way out


__all__ = ["prepare", "install", "uninstall", "interrupted_during_start", "caused_by_interrupt",
           "INTERRUPT_EXIT_CODE", "INTERRUPT_GRACE_S", "INTERRUPT_UNWIND_S", "INTERRUPT_QUIET_S",
           "ABORT_FLUSH_S"]
