"""``spawn``: run ``fn(rank, *args)`` in ``nprocs`` fresh processes, for scripts written
around ``torch.multiprocessing.spawn``.

    import minidist as md
    import minidist.multiprocessing as mp

    def worker(rank, steps):
        md.init_process_group()            # RANK, WORLD_SIZE, MASTER_ADDR/PORT are set
        ...
        md.destroy_process_group()

    if __name__ == "__main__":
        mp.spawn(worker, args=(100,), nprocs=4)

Under a launcher that already started ``nprocs`` ranks (``./mpirun.sh -n 2``, ``python -m
minidist.launch --nproc-per-node 2``) no process is started: each rank runs ``fn(rank, *args)``
itself, and rank 0 logs that once.

Each process starts with the "spawn" start method (a fresh interpreter, as torch does) and the
torchrun-style environment of its rank: ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` (default 127.0.0.1) and ``MASTER_PORT`` (default: a free
port, held reserved until the job ends), and one BLAS thread, so ``init_process_group()``
builds a TCP group inside. torch's ``spawn`` sets none of these, so a script that passes
``init_process_group(rank=..., world_size=...)`` itself (a multi-node job: several spawns, one
per machine) gets the values it passes; ``MINIDIST_LAUNCHER=spawn`` tells
``init_process_group`` where its defaults came from. The first process that fails ends the
others; ``spawn`` then raises ``ProcessRaisedException`` (with that rank's traceback) or
``ProcessExitedException`` (with its exit code).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import secrets
import socket
import traceback
from typing import Any, Callable

STOP_GRACE_S = 5.0  # how long the other processes get after SIGTERM before SIGKILL
BLAS_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")
FOREIGN_PREFIXES = ("PMI_", "PMIX_", "OMPI_", "HYDRA_", "MPIR_")  # an outer mpiexec's ranks


class ProcessException(Exception):
    """A spawned process failed; ``error_index`` is its rank, ``pid`` its process id."""

    def __init__(self, msg: str, error_index: int, pid: int | None) -> None:
        super().__init__(msg)
        self.msg, self.error_index, self.pid = msg, error_index, pid


class ProcessRaisedException(ProcessException):
    """``fn`` raised in the process of rank ``error_index``; the message holds its traceback."""


class ProcessExitedException(ProcessException):
    """The process of rank ``error_index`` exited with ``exit_code`` (or died of a signal)."""

    def __init__(self, msg: str, error_index: int, pid: int | None, exit_code: int) -> None:
        super().__init__(msg, error_index, pid)
        self.exit_code = exit_code


def _wrap(fn: Callable[..., Any], rank: int, args: tuple, error_pipe: Any) -> None:
    """The child's entry point: run fn, send the traceback to the parent if it raises."""
    try:
        fn(rank, *args)
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except BaseException:
        error_pipe.send(traceback.format_exc())
        error_pipe.close()
        raise SystemExit(1) from None


class ProcessContext:
    """The running processes of one ``spawn``; ``join()`` waits for them (torch's API)."""

    def __init__(self, processes: list, error_pipes: list,
                 reservation: socket.socket | None = None) -> None:
        self.processes, self.error_pipes = processes, error_pipes
        self.reservation = reservation  # holds MASTER_PORT until the job ends

    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the processes: True when all ended cleanly, False if ``timeout`` passed.

        Raises:
            ProcessRaisedException, ProcessExitedException: the first process that failed
                (the others are terminated first).
        """
        live = {p.sentinel: i for i, p in enumerate(self.processes) if p.exitcode is None}
        while live:
            ready = multiprocessing.connection.wait(list(live), timeout=timeout)
            if not ready:
                return False
            for sentinel in ready:
                i = live.pop(sentinel)
                self.processes[i].join()
                if self.processes[i].exitcode != 0:
                    self._stop_others()
                    raise self._failure(i)
        self._release()
        return True

    def _release(self) -> None:
        if self.reservation is not None:
            self.reservation.close()
            self.reservation = None

    def _stop_others(self) -> None:
        for p in self.processes:
            if p.exitcode is None:
                p.terminate()
        for p in self.processes:
            p.join(STOP_GRACE_S)
            if p.exitcode is None:
                p.kill()
                p.join()
        self._release()

    def _failure(self, i: int) -> ProcessException:
        p = self.processes[i]
        pipe = self.error_pipes[i]
        if pipe.poll():
            tb = pipe.recv()
            last = tb.rstrip().splitlines()[-1] if tb.strip() else "?"
            return ProcessRaisedException(
                f"minidist.multiprocessing.spawn: process {i} (rank {i}) raised {last}; the "
                f"other processes were stopped.\n\n-- traceback of rank {i} --\n{tb}", i, p.pid)
        code = p.exitcode
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        return ProcessExitedException(
            f"minidist.multiprocessing.spawn: process {i} (rank {i}) {how}; the other "
            "processes were stopped.", i, p.pid, code)


def _reserve_port() -> socket.socket:
    """A socket holding a free port until the job ends (``SO_REUSEADDR``, never listening):
    rank 0's rendezvous listener can still bind it, other programs cannot take it meanwhile
    (as ``python -m minidist.launch --standalone`` does)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    return s


def _launched_rank(nprocs: int) -> int | None:
    """This process's rank when a launcher already started ``nprocs`` ranks, else None.

    Under ``./mpirun.sh -n N`` or ``python -m minidist.launch --nproc-per-node N`` every rank
    runs the script, so each one calls ``spawn``: starting ``nprocs`` more processes per rank
    would start N x nprocs ranks that meet on one port. Instead each rank runs ``fn(rank)``
    itself (rank 0 says so once).

    Raises:
        ValueError: the launcher started a different number of ranks than ``nprocs``.
    """
    from minidist.comm.env import MPI_LAUNCHERS, detect_launch  # lazily: spawn is a leaf
    from minidist.logger import get_logger
    info = detect_launch()
    launcher = (info.launcher in MPI_LAUNCHERS or info.started_by == "launch"
                or bool(os.environ.get("TORCHELASTIC_RUN_ID")))  # a launcher, not RANK by hand
    if not launcher or info.world_size in (None, 1):
        return None  # e.g. imagenet's multi-node mode: one spawn per node, as torch does
    if info.world_size != nprocs:
        raise ValueError(
            f"[rank {info.rank}/{info.world_size}] spawn(nprocs={nprocs}): the launcher "
            f"({info.launcher}) already started {info.world_size} ranks, each running this "
            f"script. Start it with {nprocs} ranks (./mpirun.sh -n {nprocs} python ...), or "
            "run it as a plain `python script.py` and let spawn start the ranks.")
    if info.rank == 0:
        get_logger(__name__).warning(
            "spawn(nprocs=%d) under %s: the launcher already started the %d ranks, so each "
            "runs fn(rank) itself instead of starting new processes", nprocs, info.launcher,
            nprocs)
    return info.rank


def spawn(fn: Callable[..., Any], args: tuple = (), nprocs: int = 1, join: bool = True,
          daemon: bool = False, start_method: str = "spawn") -> ProcessContext | None:
    """Run ``fn(rank, *args)`` for rank 0..nprocs-1, each in a new process (torch's signature).

    Args:
        fn: a module-level function (it is pickled by name); its first argument is the rank.
        args: the remaining arguments of ``fn``.
        nprocs: how many processes (the world size).
        join: wait for all of them (True) or return the ``ProcessContext`` at once (False).
        daemon: make the processes daemonic.
        start_method: "spawn" (the default, as torch), "forkserver" or "fork".

    Returns:
        None when ``join`` is True, else the ProcessContext.

    Raises:
        ValueError: ``nprocs`` < 1.
        ProcessRaisedException: ``fn`` raised on some rank (its traceback is in the message).
        ProcessExitedException: a process exited non-zero without a Python exception.
    """
    if nprocs < 1:
        raise ValueError(f"spawn: nprocs={nprocs} must be >= 1.")
    launched = _launched_rank(nprocs)
    if launched is not None:  # mpiexec or minidist.launch already started the ranks
        fn(launched, *args)
        return None if join else ProcessContext([], [])  # nothing left to wait for
    ctx = multiprocessing.get_context(start_method)
    reservation = None if os.environ.get("MASTER_PORT") else _reserve_port()
    port = os.environ.get("MASTER_PORT") or str(reservation.getsockname()[1])
    # The children inherit os.environ as it is when each starts: set their variables there
    # for the start only (before the child imports NumPy, so the BLAS pin takes effect).
    saved = dict(os.environ)
    processes, pipes = [], []
    try:
        for k in [k for k in os.environ if k.startswith(FOREIGN_PREFIXES)]:
            del os.environ[k]
        for var in BLAS_VARS:
            os.environ.setdefault(var, "1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.update(MASTER_PORT=port, WORLD_SIZE=str(nprocs),
                          LOCAL_WORLD_SIZE=str(nprocs), MINIDIST_LAUNCHER="spawn")
        if reservation is not None:  # this machine alone: a run id and a secret of its own
            os.environ["MINIDIST_RUN_ID"] = os.environ.get("MINIDIST_RUN_ID") or \
                f"spawn-{secrets.token_hex(4)}"
            os.environ["MINIDIST_AUTH_TOKEN"] = os.environ.get("MINIDIST_AUTH_TOKEN") or \
                secrets.token_hex(16)
        for rank in range(nprocs):
            os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank))
            recv_end, send_end = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_wrap, args=(fn, rank, tuple(args), send_end), daemon=daemon)
            p.start()
            send_end.close()
            processes.append(p)
            pipes.append(recv_end)
    except BaseException:
        for p in processes:
            p.kill()
        if reservation is not None:
            reservation.close()
        raise
    finally:
        os.environ.clear()
        os.environ.update(saved)
    context = ProcessContext(processes, pipes, reservation)
    if not join:
        return context
    try:
        context.join()
    except BaseException:
        context._stop_others()  # Ctrl-C in the parent, or a failure: leave nothing behind
        raise
    return None
