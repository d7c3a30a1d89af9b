"""Launcher detection, in one place: who started this process, and which rank is it?

    info = detect_launch()            # reads os.environ (or pass a dict, as the tests do)
    info.launcher, info.rank, info.world_size, info.local_rank, info.master_addr, info.master_port
    backend = default_backend(info)   # "mpi" | "tcp" | "local"  (what backend="auto" picks)

Checked in this order (the first that matches wins):

  launcher   variables read                                                  backend "auto"
  openmpi    OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK    mpi
  hydra      PMI_RANK, PMI_SIZE, MPI_LOCALRANKID  (MPICH / Intel MPI mpiexec)          mpi
  pmix       PMIX_RANK (size comes from MPI itself after init)                         mpi
  torchrun   RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT                    tcp
  slurm      SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID  (srun; mpi4py works under it)  mpi
  single     nothing set: one process, with a logged warning                           local

A wrong value raises ValueError naming the variable and the fix (``WORLD_SIZE='four'``,
``RANK=4`` with ``WORLD_SIZE=4``, a ``WORLD_SIZE`` that disagrees with ``mpiexec -n``).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Mapping

from minidist.log import get_logger

log = get_logger(__name__)


@dataclasses.dataclass(frozen=True)
class LaunchInfo:
    """What the launcher told this process. ``world_size`` is None when only MPI knows it."""

    launcher: str  # "openmpi" | "hydra" | "pmix" | "torchrun" | "slurm" | "single"
    rank: int
    world_size: int | None
    local_rank: int
    master_addr: str | None = None
    master_port: int | None = None


def _int(env: Mapping[str, str], name: str, default: int | None = None,
         minimum: int = 0) -> int | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer. Set it to a "
                         f"whole number (your launcher normally does), or unset it.") from None
    if value < minimum:
        raise ValueError(f"environment variable {name}={value} must be >= {minimum}.")
    return value


def _check_rank(launcher: str, rank_var: str, rank: int, size_var: str, size: int | None) -> None:
    if size is not None and rank >= size:
        raise ValueError(f"{launcher}: {rank_var}={rank} but {size_var}={size}; a rank must be in "
                         f"[0, {size}). Check the launcher command (every rank needs the same "
                         f"{size_var} and a distinct {rank_var} below it).")


def _check_world_size_agrees(env: Mapping[str, str], launcher: str, size: int | None) -> None:
    explicit = _int(env, "WORLD_SIZE", minimum=1)
    if explicit is not None and size is not None and explicit != size:
        raise ValueError(
            f"{launcher}: the MPI launcher started {size} ranks but WORLD_SIZE={explicit} is also "
            f"set. They must agree: run `mpiexec -n {explicit} ...`, or unset WORLD_SIZE (under "
            "mpiexec the MPI world size is used).")


def detect_launch(env: Mapping[str, str] | None = None) -> LaunchInfo:
    """Read the launcher variables from ``env`` (default ``os.environ``); see the module table.

    Raises:
        ValueError: a launcher variable is malformed or inconsistent (message names it).
    """
    env = os.environ if env is None else env
    if "OMPI_COMM_WORLD_RANK" in env:
        launcher, rank_var, size_var = "openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"
        local = _int(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0)
    elif "PMI_RANK" in env:
        launcher, rank_var, size_var = "hydra", "PMI_RANK", "PMI_SIZE"
        local = _int(env, "MPI_LOCALRANKID", None)
        local = _int(env, "PMI_LOCAL_RANK", 0) if local is None else local
    elif "PMIX_RANK" in env:
        launcher, rank_var, size_var = "pmix", "PMIX_RANK", "PMIX_SIZE"
        local = _int(env, "PMIX_LOCAL_RANK", 0)
    else:
        launcher = ""
    if launcher:
        rank = _int(env, rank_var)
        size = _int(env, size_var, None, minimum=1)
        _check_rank(launcher, rank_var, rank, size_var, size)
        _check_world_size_agrees(env, launcher, size)
        return LaunchInfo(launcher, rank, size, local)

    if "RANK" in env or "WORLD_SIZE" in env:
        if "RANK" not in env or "WORLD_SIZE" not in env:
            missing = "RANK" if "RANK" not in env else "WORLD_SIZE"
            raise ValueError(f"torchrun-style launch: {missing} is not set but "
                             f"{'WORLD_SIZE' if missing == 'RANK' else 'RANK'} is. Set both "
                             "(plus LOCAL_RANK, MASTER_ADDR, MASTER_PORT), or use torchrun.")
        rank = _int(env, "RANK")
        size = _int(env, "WORLD_SIZE", minimum=1)
        _check_rank("torchrun", "RANK", rank, "WORLD_SIZE", size)
        port = _int(env, "MASTER_PORT", None, minimum=1)
        if port is not None and port > 65535:
            raise ValueError(f"MASTER_PORT={port} is not a TCP port; use 1..65535.")
        return LaunchInfo("torchrun", rank, size, _int(env, "LOCAL_RANK", 0),
                          env.get("MASTER_ADDR") or "127.0.0.1", port)

    if "SLURM_PROCID" in env:
        rank = _int(env, "SLURM_PROCID")
        size = _int(env, "SLURM_NTASKS", None, minimum=1)
        _check_rank("slurm", "SLURM_PROCID", rank, "SLURM_NTASKS", size)
        return LaunchInfo("slurm", rank, size, _int(env, "SLURM_LOCALID", 0))

    return LaunchInfo("single", 0, 1, 0)


def default_backend(info: LaunchInfo) -> str:
    """What ``backend="auto"`` picks for this launch: "mpi", "tcp" or "local"."""
    if info.launcher in ("openmpi", "hydra", "pmix", "slurm"):
        return "mpi"
    if info.launcher == "torchrun":
        return "tcp"
    return "local"


def warn_if_single(info: LaunchInfo) -> None:
    """Log the single-process warning once per call site (init_process_group calls it)."""
    if info.launcher == "single":
        log.warning("no launcher detected (no OMPI_*/PMI_*/PMIX_*/RANK/SLURM_* variables): "
                    "running as a single process. Use `./mpirun.sh -n 4 python ...` or torchrun "
                    "for several ranks.")
