"""The public, torch-style functions: ``init_process_group`` and collectives on the default group.

    import minidist as md
    md.init_process_group()                  # backend="auto": mpi under mpiexec/srun, tcp under
    rank, n = md.get_rank(), md.get_world_size()     # torchrun-style variables, local otherwise
    md.all_reduce(grad, op="avg")            # in place, identical bits on every rank
    md.barrier()
    md.destroy_process_group()

Run with ``./mpirun.sh -n 4 python script.py``. Before ``init_process_group`` the rank queries
answer for a single process (rank 0 of 1) so logging code works anywhere; collectives raise.

Every collective is recorded in the group's ledger (``get_ledger()``, ``ledger_label``; see
``minidist.comm.ledger``), and ``auto_table()`` shows what ``algorithm="auto"`` will pick.

``init_process_group`` also installs a ``sys.excepthook`` and ``threading.excepthook``: an
uncaught exception on one rank prints its traceback prefixed with ``[rank r/N]`` and then, under
MPI, calls ``MPI.COMM_WORLD.Abort(1)``, so the whole job ends at once instead of the other ranks
waiting for a message that never comes (over TCP it closes the transport, which wakes the peers).
"""

from __future__ import annotations

import datetime
import sys
import threading
import traceback
from typing import Any

from minidist import log as mdlog
from minidist.comm.env import LaunchInfo, default_backend, detect_launch, warn_if_single
from minidist.comm.group import ProcessGroup
from minidist.comm.ledger import LedgerEntry
from minidist.comm.ops import ReduceOp
from minidist.comm.transports.base import DEFAULT_TIMEOUT_S, Transport

log = mdlog.get_logger(__name__)

_group: ProcessGroup | None = None
_info: LaunchInfo | None = None
_saved_hooks: tuple | None = None
BACKENDS = ("auto", "mpi", "tcp", "local")


def _timeout_s(timeout: float | datetime.timedelta | None) -> float:
    if timeout is None:
        return DEFAULT_TIMEOUT_S
    if isinstance(timeout, datetime.timedelta):
        timeout = timeout.total_seconds()
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ValueError(f"init_process_group: timeout={timeout!r} must be a positive number of "
                         "seconds or a datetime.timedelta.")
    return float(timeout)


def _make_transport(backend: str, info: LaunchInfo, timeout_s: float) -> Transport:
    if backend == "local":
        from minidist.comm.transports.local import LocalTransport
        return LocalTransport(timeout_s)
    if backend == "mpi":
        from minidist.comm.transports.mpi import MPITransport
        t = MPITransport(timeout_s=timeout_s)
        if info.world_size is not None and info.launcher != "slurm" and t.size != info.world_size:
            raise ValueError(f"init_process_group: the launcher says {info.world_size} ranks but "
                             f"MPI has {t.size}. mpi4py is linked to a different MPI than the "
                             "mpiexec you ran; use the mpiexec beside mpi4py (./mpirun.sh).")
        return t
    # tcp
    try:
        from minidist.comm.transports.tcp import TCPTransport
    except ImportError as e:
        raise RuntimeError(f"init_process_group(backend='tcp'): the TCP transport is not "
                           f"available ({e}). Use backend='mpi' under mpiexec.") from e
    if info.launcher != "torchrun" or info.master_port is None:
        raise ValueError("init_process_group(backend='tcp'): needs RANK, WORLD_SIZE, MASTER_ADDR "
                         "and MASTER_PORT in the environment (as torchrun sets them); "
                         f"detected launcher={info.launcher!r}, MASTER_PORT={info.master_port}.")
    return TCPTransport(info.rank, info.world_size, info.master_addr, info.master_port, timeout_s)


def _install_excepthooks(group: ProcessGroup) -> None:
    global _saved_hooks
    if _saved_hooks is None:
        _saved_hooks = (sys.excepthook, threading.excepthook)
    prev_sys, _ = _saved_hooks

    def end_world(exc_type: Any, exc: Any, tb: Any, where: str) -> None:
        text = "".join(traceback.format_exception(exc_type, exc, tb))
        prefix = mdlog.rank_prefix()
        sys.stderr.write("".join(f"{prefix} {line}\n" for line in text.rstrip().splitlines()))
        sys.stderr.write(f"{prefix} uncaught exception {where}; ending the job on all "
                         f"{group.size} ranks.\n")
        sys.stderr.flush()
        abort = getattr(group.transport, "abort", None)
        if callable(abort):
            abort(1)  # MPI: takes every rank down (does not return)
        group.transport.close()  # TCP and others: peers see the closed connection

    def sys_hook(exc_type: Any, exc: Any, tb: Any) -> None:
        if issubclass(exc_type, KeyboardInterrupt) or group.size == 1:
            prev_sys(exc_type, exc, tb)
            return
        end_world(exc_type, exc, tb, "in the main thread")

    def thread_hook(args: Any) -> None:
        if args.exc_type is SystemExit or group.size == 1:
            _saved_hooks[1](args)
            return
        end_world(args.exc_type, args.exc_value, args.exc_traceback,
                  f"in thread {getattr(args.thread, 'name', '?')}")

    sys.excepthook = sys_hook
    threading.excepthook = thread_hook


def init_process_group(backend: str = "auto", timeout: float | datetime.timedelta | None = None,
                       algorithm: str = "auto") -> ProcessGroup:
    """Create the default process group from the launcher's environment.

    Args:
        backend: "auto" (mpi under mpiexec/srun, tcp under torchrun-style env, else local),
            "mpi", "tcp" or "local".
        timeout: deadline of every blocking wait, in seconds or a timedelta
            (default ``MINIDIST_TIMEOUT_S``, 300 s).
        algorithm: default all-reduce algorithm of the group ("auto" picks by cost model).

    Returns:
        The default ProcessGroup (also used by the module-level collectives).

    Raises:
        ValueError: unknown backend, malformed launcher variables, or already initialized.
        CommError: MPI requested but mpi4py or the MPI library is missing.
    """
    global _group, _info
    if backend not in BACKENDS:
        raise ValueError(f"init_process_group: unknown backend {backend!r}; use one of {BACKENDS}.")
    if _group is not None:
        raise ValueError(f"init_process_group: already initialized ({_group!r}). Call "
                         "destroy_process_group() first.")
    timeout_s = _timeout_s(timeout)
    info = detect_launch()
    chosen = default_backend(info) if backend == "auto" else backend
    if chosen == "local":
        warn_if_single(info)
        if info.world_size not in (None, 1):
            raise ValueError(f"init_process_group(backend='local'): the launcher ({info.launcher}) "
                             f"started {info.world_size} ranks but 'local' runs one. Use "
                             "backend='auto'.")
    transport = _make_transport(chosen, info, timeout_s)
    group = ProcessGroup(transport, algorithm=algorithm, backend=chosen)
    _group, _info = group, info
    mdlog.set_rank(group.rank, group.size)
    _install_excepthooks(group)
    log.info("process group ready: backend=%s launcher=%s rank=%d world_size=%d local_rank=%d "
             "timeout=%.0fs", chosen, info.launcher, group.rank, group.size, info.local_rank,
             timeout_s)
    return group


def destroy_process_group() -> None:
    """Close the default group's transport and restore the exception hooks. Idempotent.

    First every rank compares how many collectives it made with the others (the ledger's
    farewell, waiting at most the timeout for late ranks): a rank that skipped or added a
    collective raises CollectiveMismatch here, with the group left open (call again to close).
    With ``MINIDIST_LEDGER_DUMP=dir`` each rank then writes its ledger to ``dir``.
    """
    global _group, _info, _saved_hooks
    if _group is not None:
        _group.farewell()  # may raise: the exception hooks are still installed
    if _saved_hooks is not None:
        sys.excepthook, threading.excepthook = _saved_hooks
        _saved_hooks = None
    if _group is not None:
        _group.close()
    _group, _info = None, None


def is_initialized() -> bool:
    """True between ``init_process_group`` and ``destroy_process_group``."""
    return _group is not None


def get_default_group() -> ProcessGroup:
    """The default group; raises RuntimeError if ``init_process_group`` was not called."""
    if _group is None:
        raise RuntimeError(f"{mdlog.rank_prefix()} minidist collectives need a process group: "
                           "call minidist.init_process_group() first.")
    return _group


def get_rank() -> int:
    """This process's rank (0 before ``init_process_group``)."""
    return 0 if _group is None else _group.rank


def get_world_size() -> int:
    """Number of ranks (1 before ``init_process_group``)."""
    return 1 if _group is None else _group.size


def get_local_rank() -> int:
    """Rank on this node (from the launcher: OMPI/MPI_LOCALRANKID/LOCAL_RANK/SLURM_LOCALID)."""
    return (_info.local_rank if _info is not None else detect_launch().local_rank)


def is_main_process() -> bool:
    """True on rank 0 (the rank that prints progress and writes checkpoints)."""
    return get_rank() == 0


def _g(group: ProcessGroup | None) -> ProcessGroup:
    return group if group is not None else get_default_group()


def barrier(group: ProcessGroup | None = None) -> None:
    """Wait until every rank of the group arrives."""
    _g(group).barrier()


def all_reduce(array: Any, op: str | ReduceOp = "sum", algorithm: str | None = None,
               group: ProcessGroup | None = None, label: str | None = None) -> Any:
    """Reduce ``array`` in place across ranks and return it; see ``ProcessGroup.all_reduce``.

    ``label`` (e.g. ``"bucket=3"``) is kept in this call's ledger entry.
    """
    return _g(group).all_reduce(array, op, algorithm, label=label)


def broadcast(array: Any, src: int = 0, group: ProcessGroup | None = None) -> Any:
    """Copy rank ``src``'s ``array`` into ``array`` on every rank (in place); returns it."""
    return _g(group).broadcast(array, src)


def reduce(array: Any, dst: int = 0, op: str | ReduceOp = "sum",
           group: ProcessGroup | None = None) -> Any:
    """Reduce into ``array`` on rank ``dst`` only; other ranks keep their data."""
    return _g(group).reduce(array, dst, op)


def all_gather(array: Any, group: ProcessGroup | None = None) -> Any:
    """A new ``(world_size, *array.shape)`` array: row r is rank r's ``array``."""
    return _g(group).all_gather(array)


def all_gather_into(output: Any, array: Any, group: ProcessGroup | None = None) -> Any:
    """Fill ``output`` (world_size * array.size elements) with every rank's ``array``."""
    return _g(group).all_gather_into(output, array)


def reduce_scatter(output: Any, input: Any, op: str | ReduceOp = "sum",
                   group: ProcessGroup | None = None) -> Any:
    """Rank r gets chunk r of the reduction of ``input`` (world_size * output.size elements)."""
    return _g(group).reduce_scatter(output, input, op)


def broadcast_object(obj: Any = None, src: int = 0, group: ProcessGroup | None = None) -> Any:
    """Rank ``src``'s JSON-able ``obj`` on every rank."""
    return _g(group).broadcast_object(obj, src)


def all_gather_object(obj: Any, group: ProcessGroup | None = None) -> list:
    """Every rank's JSON-able ``obj``, as a list indexed by rank."""
    return _g(group).all_gather_object(obj)


def get_ledger(group: ProcessGroup | None = None, last: int | None = None) -> list[LedgerEntry]:
    """The group's recorded collectives, oldest first (at most the last ``last``).

        for e in minidist.comm.get_ledger(last=3):
            print(e.seq, e.describe(), e.algorithm, e.reason, e.where, e.status)
    """
    return _g(group).ledger.entries(last=last)


def auto_table(group: ProcessGroup | None = None) -> dict:
    """What ``algorithm="auto"`` picks on the group at every power-of-two size (JSON-able).

    Not collective. Keys: ``backend``, ``transport``, ``world_size``, ``has_native``,
    ``has_shm``, ``candidates``, ``rules``, ``model``, ``sizes`` (per size: the algorithm, its
    reason and predicted microseconds, for a plain buffer and for a shared-window buffer).
    """
    return _g(group).auto_table()
