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

The watch wing (loaded unless ``MINIDIST_WINGS`` leaves it out) records every collective in
the group's ledger (``get_ledger()``) and, through ``JOB_HOOKS``, makes an uncaught exception
on one rank end the whole job with its ``[rank r/N]`` traceback. The torch-compatible options
of ``init_process_group``: init_options.py; sub-groups, object collectives: api_beyond_tensors.py.
"""

from __future__ import annotations

import datetime
from typing import Any

from minidist import logger as mdlog
from minidist.comm.backends import make_transport
from minidist.comm.env import LaunchInfo, apply_init_args, detect_launch
from minidist.comm.group import ProcessGroup
from minidist.comm.init_options import (check_init_args, choose_backend, export_rank_env,
                                        raise_if_launched, timeout_seconds)
from minidist.comm.ops import ReduceOp

log = mdlog.get_logger(__name__)

_group: ProcessGroup | None = None
_info: LaunchInfo | None = None


class JobHooks:
    """What a wing does around the default group's life (``JOB_HOOKS``); no-ops here (the
    watch wing's, minidist/watch/attach.py: start checks, excepthooks, Ctrl-C)."""

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


def init_process_group(backend: str | None = None, init_method: str | None = None,
                       timeout: float | datetime.timedelta | None = None, world_size: int = -1,
                       rank: int = -1, store: Any = None, group_name: str = "",
                       pg_options: Any = None, device_id: Any = None, *,
                       algorithm: str = "auto") -> ProcessGroup:
    """Create the default process group from the launcher's environment (torch's signature).

        md.init_process_group()                          # whatever the launcher implies
        md.init_process_group("gloo", init_method="tcp://127.0.0.1:29500", rank=r, world_size=n)

    Args:
        backend: None or "auto" (what the launcher implies), "mpi", "tcp", "local", or torch's
            "gloo" and "nccl" (init_options.py says what each runs).
        init_method: "env://" (the default: ``MASTER_ADDR``/``MASTER_PORT``) or
            "tcp://host:port", the rendezvous address of the TCP transport.
        timeout: deadline of every blocking wait, in seconds or a timedelta
            (default ``MINIDIST_TIMEOUT_S``, 300 s).
        world_size, rank: -1 reads them from the launcher's environment; pass both or neither.
        store, group_name, pg_options, device_id: torch's (init_options.py).
        algorithm: default all-reduce algorithm of the group ("auto" picks by cost model).

    Returns:
        The default ProcessGroup (also used by the module-level collectives).

    Raises:
        ValueError: unknown backend, malformed launcher variables or init_method, rank and
            world_size that disagree with the launcher, or already initialized.
        CommError: MPI requested but mpi4py or the MPI library is missing.
    """
    global _group, _info
    backend = check_init_args(backend, store, pg_options)
    if _group is not None:
        raise ValueError(f"init_process_group: already initialized ({_group!r}). Call "
                         "destroy_process_group() first.")
    info: LaunchInfo | None = None
    try:  # a job that cannot start ends with one line (the watch wing's start_failed)
        timeout_s = timeout_seconds(timeout)
        for hooks in JOB_HOOKS:
            hooks.before_launch()
        info = apply_init_args(detect_launch(), init_method, world_size, rank)
        chosen = choose_backend(backend, info)
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
    export_rank_env(group.rank, group.size, info)
    log.info("process group ready: backend=%s launcher=%s rank=%d world_size=%d local_rank=%d "
             "timeout=%.0fs", chosen, info.launcher, group.rank, group.size, info.local_rank,
             timeout_s)
    return group


def destroy_process_group() -> None:
    """Close the default group's transport and restore the exception hooks. Idempotent.

    First the group's farewell (the watch wing's: every rank compares its collective counts
    with the others and raises CollectiveMismatch, the group left open, if a rank skipped one).
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
    process has no group yet (an answer of rank 0 of 1 would be silently wrong on every rank;
    init_options.py: ``raise_if_launched``)."""
    if _group is None:
        raise_if_launched(what)


def get_rank() -> int:
    """This process's rank; 0 in a single process without a group (RuntimeError before
    ``init_process_group`` in one of several launched ranks)."""
    if _group is None:
        require_group_if_launched("get_rank()")
        return 0
    return _group.rank


def get_world_size() -> int:
    """Number of ranks; 1 in a single process without a group (RuntimeError before
    ``init_process_group`` in one of several launched ranks)."""
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

    ``label`` (e.g. ``f"iteration {i}"``) is part of the call's fingerprint: ranks that pass
    different labels raise ``CollectiveMismatch`` in that call (docs/troubleshooting.md).
    ``async_op=True`` queues it on the group's worker and returns a :class:`Work` at once
    (comm/work.py); do not touch ``array`` until ``work.wait()`` returns.
    """
    g = group if group is not None else _group or get_default_group()
    if not async_op:  # the common case, called straight (every gradient bucket comes here)
        return g.all_reduce(array, op, algorithm, 0, label, 2)  # (2: name my caller's line)
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


# Beside the textbook's: sub-groups, small Python objects, the ledger, auto's table.
from minidist.comm.api_beyond_tensors import (  # noqa: E402,F401
    all_gather_object, auto_table, broadcast_object, get_ledger, new_group)
