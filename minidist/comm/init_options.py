"""The torch-compatible options of ``init_process_group``: backend names, timeouts, env export.

    backend  None or "auto": mpi under mpiexec/srun, tcp under torchrun-style variables or an
             explicit rank/world_size, else local; or "mpi", "tcp", "local". torch's "gloo"
             runs the TCP transport (under mpiexec/srun with no MASTER_PORT: the MPI transport,
             with a warning), "nccl" the default transport with GPU arrays (one log line says
             what was chosen; without a GPU it runs on the CPU, with a warning).
    timeout  seconds or a ``datetime.timedelta`` (default ``MINIDIST_TIMEOUT_S``, 300 s)
    store, pg_options   torch's; not supported (must be None)
    group_name, device_id   accepted for torch compatibility; unused (place arrays with
             ``minidist.device``)

Under mpiexec or srun, ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE`` are set in ``os.environ``
once the group is up (where unset), so scripts that read ``os.environ["LOCAL_RANK"]`` run as is.
"""

from __future__ import annotations

import datetime
import os
from typing import Any

from minidist.comm.backends import BACKENDS, TORCH_BACKENDS, torch_backend_note
from minidist.comm.env import (MPI_LAUNCHERS, LaunchInfo, default_backend, detect_launch,
                               warn_if_single)
from minidist.comm.transports.base import DEFAULT_TIMEOUT_S


def check_init_args(backend: str | None, store: Any, pg_options: Any) -> str:
    """The backend name, lower case ("auto" for None); ValueError for an unknown one, or a
    ``store``/``pg_options`` (torch's, not supported)."""
    backend = "auto" if backend is None else str(backend).lower()
    if backend not in BACKENDS:
        raise ValueError(f"init_process_group: unknown backend {backend!r}; use one of {BACKENDS}.")
    if store is not None or pg_options is not None:
        raise ValueError("init_process_group: store= and pg_options= are not supported; pass "
                         "init_method='env://' or 'tcp://host:port' instead.")
    return backend


def timeout_seconds(timeout: float | datetime.timedelta | None) -> float:
    """``timeout`` in seconds (None: ``MINIDIST_TIMEOUT_S``); ValueError unless positive."""
    if timeout is None:
        return DEFAULT_TIMEOUT_S
    if isinstance(timeout, datetime.timedelta):
        timeout = timeout.total_seconds()
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ValueError(f"init_process_group: timeout={timeout!r} must be a positive number of "
                         "seconds or a datetime.timedelta.")
    return float(timeout)


def choose_backend(backend: str, info: LaunchInfo) -> str:
    """The transport ``backend`` runs as under the launch ``info`` ("mpi", "tcp", "local").

    Raises:
        ValueError: "local" asked for, but the launcher started several ranks.
    """
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
    return chosen


def export_rank_env(rank: int, size: int, info: LaunchInfo) -> None:
    """Under mpiexec/srun, set RANK, LOCAL_RANK, WORLD_SIZE (if unset) for torch-style scripts."""
    if info.launcher in MPI_LAUNCHERS:
        os.environ.setdefault("RANK", str(rank))
        os.environ.setdefault("LOCAL_RANK", str(info.local_rank))
        os.environ.setdefault("WORLD_SIZE", str(size))


def raise_if_launched(what: str) -> None:
    """Raise torch's "not initialized" error for ``what`` (a process with no group yet) when
    the launcher's variables say this is one of several ranks; return in a plain process.

    Raises:
        RuntimeError: the launcher's variables say world size > 1.
    """
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
