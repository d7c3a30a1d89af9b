"""The public, torch-style functions: ``init_process_group`` and collectives on the default group.

    import minidist as md
    md.init_process_group()                  # backend="auto": mpi under mpiexec/srun, tcp under
    rank, n = md.get_rank(), md.get_world_size()     # torchrun-style variables, local otherwise
    md.all_reduce(grad, op="avg")            # in place, identical bits on every rank
    md.barrier()
    md.destroy_process_group()

Run with ``./mpirun.sh -n 4 python script.py``. Before ``init_process_group``, in a process a
launcher started as one of several ranks, the rank queries raise as torch's do (an answer of
"rank 0 of 1" there would run every ``if get_rank() == 0:`` block on every rank); in a plain
single process they answer rank 0 of 1. Collectives always raise without a group.

With the watch wing (loaded unless ``MINIDIST_WINGS`` leaves it out) every collective is
recorded in the group's ledger (``get_ledger()``, ``ledger_label``; see
``minidist.watch.diagnosis.ledger``), and ``auto_table()`` shows what ``algorithm="auto"`` will
pick.

The watch wing's ``JOB_HOOKS`` install excepthooks in ``init_process_group``: an uncaught
exception on one rank prints its traceback prefixed with ``[rank r/N]`` and ends the whole job
at once (MPI's Abort; over TCP the closed transport wakes the peers); Ctrl-C ends every rank in
one line (``minidist.watch.failure.interrupts``).
"""

from __future__ import annotations

import datetime
import os
from typing import Any

from minidist import logger as mdlog
from minidist.comm.env import (MPI_LAUNCHERS, LaunchInfo, apply_init_args, default_backend,
                               detect_launch, warn_if_single)
from minidist.comm.backends import BACKENDS, TORCH_BACKENDS, make_transport, torch_backend_note
from minidist.comm.group import ProcessGroup
from minidist.comm.ops import ReduceOp
from minidist.comm.transports.base import DEFAULT_TIMEOUT_S

log = mdlog.get_logger(__name__)

_group: ProcessGroup | None = None
_info: LaunchInfo | None = None


class JobHooks:
    """What a wing does around the default group's life (``JOB_HOOKS``); no-ops here (the
    watch wing's: minidist/watch/attach.py)."""

    def before_launch(self) -> None:
        """``init_process_group`` starts (before the launcher's variables are read)."""

    def before_transport(self, info: LaunchInfo) -> None:
        """The transport is about to be made (the rendezvous may wait)."""

    def start_failed(self, error: BaseException, rank: int | None) -> None:
        """The start raised ``error`` (it is raised after every hook saw it)."""

    def started(self, group: ProcessGroup) -> None:
        """The default group is ready."""

    def stopping(self) -> None:
        """``destroy_process_group``: after the farewell, before the group closes."""


JOB_HOOKS: list[JobHooks] = []  # a wing appends its own when it loads


def _timeout_s(timeout: float | datetime.timedelta | None) -> float:
    if timeout is None:
        return DEFAULT_TIMEOUT_S
    if isinstance(timeout, datetime.timedelta):
        timeout = timeout.total_seconds()
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ValueError(f"init_process_group: timeout={timeout!r} must be a positive number of "
                         "seconds or a datetime.timedelta.")
    return float(timeout)


def _export_rank_env(group: ProcessGroup, info: LaunchInfo) -> None:
    """Under mpiexec/srun, set RANK, LOCAL_RANK, WORLD_SIZE (if unset) for torch-style scripts."""
    if info.launcher in MPI_LAUNCHERS:
        os.environ.setdefault("RANK", str(group.rank))
        os.environ.setdefault("LOCAL_RANK", str(info.local_rank))
        os.environ.setdefault("WORLD_SIZE", str(group.size))


def init_process_group(backend: str | None = None, init_method: str | None = None,
                       timeout: float | datetime.timedelta | None = None, world_size: int = -1,
                       rank: int = -1, store: Any = None, group_name: str = "",
                       pg_options: Any = None, device_id: Any = None, *,
                       algorithm: str = "auto") -> ProcessGroup:
    """Create the default process group from the launcher's environment (torch's signature).

        md.init_process_group()                          # whatever the launcher implies
        md.init_process_group("gloo", init_method="tcp://127.0.0.1:29500", rank=r, world_size=n)

    Args:
        backend: None or "auto" (mpi under mpiexec/srun, tcp under torchrun-style env or an
            explicit rank/world_size, else local), "mpi", "tcp", "local"; torch's "gloo" runs
            the TCP transport (under mpiexec/srun with no MASTER_PORT: the MPI transport, with
            a warning), "nccl" the default transport with GPU arrays (one log line says what
            was chosen; without a GPU it runs on the CPU, with a warning).
        init_method: "env://" (the default: ``MASTER_ADDR``/``MASTER_PORT``) or
            "tcp://host:port", the rendezvous address of the TCP transport.
        timeout: deadline of every blocking wait, in seconds or a timedelta
            (default ``MINIDIST_TIMEOUT_S``, 300 s).
        world_size: number of ranks; -1 reads it from the launcher's environment.
        rank: this process's rank; -1 reads it from the environment. Pass both or neither.
        store: torch's Store; not supported (must be None).
        group_name: accepted for torch compatibility; unused.
        pg_options: torch's backend options; not supported (must be None).
        device_id: accepted for torch compatibility; place arrays with ``minidist.device``.
        algorithm: default all-reduce algorithm of the group ("auto" picks by cost model).

    Returns:
        The default ProcessGroup (also used by the module-level collectives).

    Raises:
        ValueError: unknown backend, malformed launcher variables or init_method, rank and
            world_size that disagree with the launcher, or already initialized.
        CommError: MPI requested but mpi4py or the MPI library is missing.

    Under mpiexec or srun, ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE`` are then set in
    ``os.environ`` (where unset), so scripts that read ``os.environ["LOCAL_RANK"]`` run as is.
    """
    global _group, _info
    backend = "auto" if backend is None else str(backend).lower()
    if backend not in BACKENDS:
        raise ValueError(f"init_process_group: unknown backend {backend!r}; use one of {BACKENDS}.")
    if store is not None or pg_options is not None:
        raise ValueError("init_process_group: store= and pg_options= are not supported; pass "
                         "init_method='env://' or 'tcp://host:port' instead.")
    if _group is not None:
        raise ValueError(f"init_process_group: already initialized ({_group!r}). Call "
                         "destroy_process_group() first.")
    info: LaunchInfo | None = None
    try:  # a job that cannot start ends with one line (the watch wing's start_failed)
        timeout_s = _timeout_s(timeout)
        for hooks in JOB_HOOKS:
            hooks.before_launch()
        info = apply_init_args(detect_launch(), init_method, world_size, rank)
        requested = TORCH_BACKENDS.get(backend, backend)
        if backend == "gloo" and info.launcher in MPI_LAUNCHERS and info.master_port is None:
            requested = "mpi"  # mpiexec gave rank and size but no MASTER_PORT: meet over MPI
        chosen = default_backend(info) if requested == "auto" else requested
        if backend in TORCH_BACKENDS:
            torch_backend_note(backend, chosen, info)
        if chosen == "local":
            if requested == "auto":  # backend="local" asked for one process: nothing to warn of
                warn_if_single(info)
            if info.world_size not in (None, 1):
                raise ValueError(f"init_process_group(backend='local'): the launcher "
                                 f"({info.launcher}) started {info.world_size} ranks but 'local' "
                                 "runs one. Use backend='auto'.")
        for hooks in JOB_HOOKS:
            hooks.before_transport(info)
        transport = make_transport(chosen, info, timeout_s)
    except BaseException as e:
        for hooks in JOB_HOOKS:
            hooks.start_failed(e, info.rank if info is not None else None)
        raise
    mdlog.set_rank(transport.rank, transport.size)  # before the group: its set-up logs too
    group = ProcessGroup(transport, algorithm=algorithm, backend=chosen)
    _group, _info = group, info
    for hooks in JOB_HOOKS:
        hooks.started(group)
    _export_rank_env(group, info)
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
    global _group, _info
    if _group is not None:
        _group.farewell()  # may raise: the exception hooks are still installed
    for hooks in JOB_HOOKS:
        hooks.stopping()
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


def require_group_if_launched(what: str) -> None:
    """Raise torch's "not initialized" error when a launcher started several ranks but this
    process has no group yet: an answer of rank 0 of 1 would be silently wrong on every rank.

    Raises:
        RuntimeError: no default group, and the launcher's variables say world size > 1.
    """
    if _group is not None:
        return
    try:
        info = detect_launch()
    except ValueError:  # malformed variables: init_process_group names them
        return
    if info.launcher in ("single", "explicit") or info.world_size == 1:
        return
    size = "?" if info.world_size is None else info.world_size
    raise RuntimeError(
        f"[rank {info.rank}/{size}] {what}: Default process group has not been initialized, "
        f"please make sure to call init_process_group. This process is rank {info.rank} of "
        f"{size} ({info.launcher}); without a group every rank would answer rank 0 of 1. Call "
        "minidist.init_process_group() first (before any get_rank/get_world_size, "
        "DistributedSampler or DistributedDataParallel).")


def get_rank() -> int:
    """This process's rank; 0 in a single process without a group.

    Raises:
        RuntimeError: called before ``init_process_group`` in one of several launched ranks.
    """
    if _group is None:
        require_group_if_launched("get_rank()")
        return 0
    return _group.rank


def get_world_size() -> int:
    """Number of ranks; 1 in a single process without a group.

    Raises:
        RuntimeError: called before ``init_process_group`` in one of several launched ranks.
    """
    if _group is None:
        require_group_if_launched("get_world_size()")
        return 1
    return _group.size


def get_local_rank() -> int:
    """Rank on this node (from the launcher: OMPI/MPI_LOCALRANKID/LOCAL_RANK/SLURM_LOCALID)."""
    return (_info.local_rank if _info is not None else detect_launch().local_rank)


def is_main_process() -> bool:
    """True on rank 0 (the rank that prints progress and writes checkpoints)."""
    return get_rank() == 0


def _g(group: ProcessGroup | None) -> ProcessGroup:
    return group if group is not None else get_default_group()


def barrier(group: ProcessGroup | None = None, async_op: bool = False) -> Any:
    """Wait until every rank of the group arrives (``async_op=True``: a :class:`Work`)."""
    g = _g(group)
    return _run(g, "barrier", g.barrier, None, async_op)


def _run(group: ProcessGroup | None, name: str, fn: Any, result: Any, async_op: bool) -> Any:
    """``fn()`` now, or queued on the group's async worker (``async_op=True``: a Work)."""
    if not async_op:
        fn()
        return result
    return _g(group).run_async(name, fn, result)


def all_reduce(array: Any, op: str | ReduceOp = "sum", algorithm: str | None = None,
               group: ProcessGroup | None = None, label: str | None = None,
               async_op: bool = False) -> Any:
    """Reduce ``array`` in place across ranks and return it; see ``ProcessGroup.all_reduce``.

    ``label`` (e.g. ``"bucket=3"``, ``f"iteration {i}"``) is kept in this call's ledger entry
    and is part of the call's fingerprint: ranks that pass different labels raise
    ``CollectiveMismatch`` in that call, so a loop whose calls carry the iteration catches a
    rank that skipped one where it happened (docs/troubleshooting.md). ``async_op=True``
    queues it on the group's worker and returns a :class:`Work` at once (comm/work.py); do not
    touch ``array`` until ``work.wait()`` returns.
    """
    g = group if group is not None else _group or get_default_group()
    if not async_op:  # the common case, called straight (every gradient bucket comes here)
        return g.all_reduce(array, op, algorithm, label=label)
    return _run(g, "all_reduce", lambda: g.all_reduce(array, op, algorithm, label=label), array,
                async_op)


def broadcast(array: Any, src: int = 0, group: ProcessGroup | None = None,
              async_op: bool = False) -> Any:
    """Copy rank ``src``'s ``array`` into ``array`` on every rank (in place); returns it
    (``async_op=True``: a :class:`Work`)."""
    g = _g(group)
    return _run(g, "broadcast", lambda: g.broadcast(array, src), array, async_op)


def reduce(array: Any, dst: int = 0, op: str | ReduceOp = "sum",
           group: ProcessGroup | None = None, async_op: bool = False) -> Any:
    """Reduce into ``array`` on rank ``dst`` only; other ranks keep their data
    (``async_op=True``: a :class:`Work`)."""
    g = _g(group)
    return _run(g, "reduce", lambda: g.reduce(array, dst, op), array, async_op)


def all_gather(array: Any, group: ProcessGroup | None = None) -> Any:
    """A new ``(world_size, *array.shape)`` array: row r is rank r's ``array``."""
    return _g(group).all_gather(array)


def all_gather_into(output: Any, array: Any, group: ProcessGroup | None = None,
                    async_op: bool = False) -> Any:
    """Fill ``output`` (world_size * array.size elements) with every rank's ``array``
    (``async_op=True``: a :class:`Work`)."""
    g = _g(group)
    return _run(g, "all_gather_into", lambda: g.all_gather_into(output, array), output,
                async_op)


def reduce_scatter(output: Any, input: Any, op: str | ReduceOp = "sum",
                   group: ProcessGroup | None = None, async_op: bool = False) -> Any:
    """Rank r gets chunk r of the reduction of ``input`` (world_size * output.size elements)
    (``async_op=True``: a :class:`Work`)."""
    g = _g(group)
    return _run(g, "reduce_scatter", lambda: g.reduce_scatter(output, input, op), output,
                async_op)


def new_group(ranks: list[int] | None = None, timeout: float | datetime.timedelta | None = None
              ) -> ProcessGroup | None:
    """A process group of some of the world's ranks, usable by every collective and by DDP.

    COLLECTIVE over the world: every rank calls it with the same ``ranks``, in the same order
    as its other ``new_group`` calls (torch's rule). Ranks keep their order: world rank
    ``ranks[i]`` is rank ``i`` of the new group.

        evens = minidist.new_group([0, 2])        # every rank calls this
        if evens is not None:                     # None on ranks outside the group
            minidist.all_reduce(x, group=evens)

    Every transport supports it: MPI splits the world's communicator (``MPI_Comm_split``);
    TCP and threads give the group a view of the world's connections with a tag space of its
    own (comm/transports/subgroup.py), so its messages never meet the world's.

    Returns:
        The new ProcessGroup on its member ranks; None on the others (torch returns a
        non-member marker there).

    Raises:
        ValueError: ``ranks`` are not distinct ranks of the world.
    """
    world = get_default_group()
    return world.new_group(ranks, _timeout_s(timeout) if timeout is not None else None)


def broadcast_object(obj: Any = None, src: int = 0, group: ProcessGroup | None = None) -> Any:
    """Rank ``src``'s JSON-able ``obj`` on every rank."""
    return _g(group).broadcast_object(obj, src)


def all_gather_object(obj: Any, group: ProcessGroup | None = None) -> list:
    """Every rank's JSON-able ``obj``, as a list indexed by rank."""
    return _g(group).all_gather_object(obj)


def get_ledger(group: ProcessGroup | None = None, last: int | None = None) -> list[Any]:
    """The group's recorded collectives (``LedgerEntry``), oldest first (the last ``last``).

        for e in minidist.comm.get_ledger(last=3):
            print(e.seq, e.describe(), e.algorithm, e.reason, e.where, e.status)

    Raises:
        RuntimeError: the group has no ledger (``MINIDIST_WINGS`` leaves the watch wing out).
    """
    g = _g(group)
    if g.ledger is None:
        raise RuntimeError(f"{g.where('get_ledger')}: the ledger belongs to the watch wing, "
                           "which MINIDIST_WINGS leaves out; unset MINIDIST_WINGS or add watch.")
    return g.ledger.entries(last=last)


def auto_table(group: ProcessGroup | None = None) -> dict:
    """What ``algorithm="auto"`` picks on the group at every power-of-two size (JSON-able).

    Not collective. Keys: ``backend``, ``transport``, ``world_size``, ``has_native``,
    ``has_shm``, ``candidates``, ``rules``, ``model``, ``sizes`` (per size: the algorithm, its
    reason and predicted microseconds, for a plain buffer and for a shared-window buffer).
    """
    return _g(group).auto_table()
