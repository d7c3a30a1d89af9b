"""Launcher detection, in one place: who started this process, and which rank is it?

    info = detect_launch()            # reads os.environ (or pass a dict, as the tests do)
    info.launcher, info.rank, info.world_size, info.local_rank, info.master_addr, info.master_port
    backend = default_backend(info)   # "mpi" | "tcp" | "local"  (what backend="auto" picks)
    cores_per_rank(ranks_on_this_node(world_size))   # what defaults decide from (see below)

Checked in this order (the first that matches wins):

  launcher   variables read                                                  backend "auto"
  openmpi    OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK    mpi
  hydra      PMI_RANK, PMI_SIZE, MPI_LOCALRANKID  (MPICH / Intel MPI mpiexec)          mpi
  pmix       PMIX_RANK (size comes from MPI itself after init)                         mpi
  torchrun   RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT                    tcp
  slurm      SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID  (srun; mpi4py works under it)  mpi
  single     nothing set: one process, with a logged warning                           local
  explicit   a single process given rank= and world_size= by init_process_group       tcp

``init_process_group(init_method=..., rank=..., world_size=...)`` refines what was detected
(``apply_init_args``): ``"env://"`` reads ``MASTER_ADDR``/``MASTER_PORT``, ``"tcp://host:port"``
names the rendezvous address.

A wrong value raises ValueError naming the variable and the fix (``WORLD_SIZE='four'``,
``RANK=4`` with ``WORLD_SIZE=4``, a ``WORLD_SIZE`` that disagrees with ``mpiexec -n``).

What the process can see of its machine, for defaults that depend on it (``overlap="auto"``,
spinning or yielding while waiting): ``ranks_on_this_node`` (the launcher's local size) and
``cores_per_rank`` (this process's CPU affinity, shared by those ranks unless a launcher pinned
each rank to cores of its own). The measurements behind each rule are in docs/perf_notes.md.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Mapping

from minidist.logger import get_logger

log = get_logger(__name__)


@dataclasses.dataclass(frozen=True)
class LaunchInfo:
    """What the launcher told this process. ``world_size`` is None when only MPI knows it."""

    launcher: str  # "openmpi" | "hydra" | "pmix" | "torchrun" | "slurm" | "single" | "explicit"
    rank: int
    world_size: int | None
    local_rank: int
    master_addr: str | None = None
    master_port: int | None = None
    # who set RANK/WORLD_SIZE for a "torchrun" launch (MINIDIST_LAUNCHER): "launch" (python -m
    # minidist.launch), "spawn" (minidist.multiprocessing.spawn) or "" (torchrun, or by hand)
    started_by: str = ""


def launcher_name(info: LaunchInfo) -> str:
    """The launcher as a message should name it (not "torchrun" where torchrun is absent)."""
    if info.launcher != "torchrun":
        return info.launcher
    return {"launch": "python -m minidist.launch", "spawn": "minidist.multiprocessing.spawn"
            }.get(info.started_by, "RANK/WORLD_SIZE in the environment, as torchrun sets them")


def _int(env: Mapping[str, str], name: str, default: int | None = None,
         minimum: int = 0) -> int | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer. Set it to a "
                         f"whole number, or unset it; `./mpirun.sh -n N` and `python -m "
                         "minidist.launch --nproc-per-node N` set the launcher's for you.") from None
    if value < minimum:
        raise ValueError(f"environment variable {name}={value} must be >= {minimum}.")
    return value


def _check_rank(launcher: str, rank_var: str, rank: int, size_var: str, size: int | None) -> None:
    if size is not None and rank >= size:
        raise ValueError(f"{launcher}: {rank_var}={rank} but {size_var}={size}; a rank must be in "
                         f"[0, {size}). Check the launcher command (every rank needs the same "
                         f"{size_var} and a distinct {rank_var} below it), or let `./mpirun.sh -n "
                         f"{size}` or `python -m minidist.launch --nproc-per-node {size}` "
                         "number the ranks.")


def _check_world_size_agrees(env: Mapping[str, str], launcher: str, size: int | None) -> None:
    explicit = _int(env, "WORLD_SIZE", minimum=1)
    if explicit is not None and size is not None and explicit != size:
        raise ValueError(
            f"{launcher}: the MPI launcher started {size} ranks but WORLD_SIZE={explicit} is also "
            f"set. They must agree: run `./mpirun.sh -n {explicit} ...`, or unset WORLD_SIZE (under "
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
        local = _int(env, "PMI_LOCAL_RANK", None) if local is None else local
        # srun --mpi=pmi2 sets PMI_RANK and PMI_SIZE but no local rank: SLURM's variable has it
        local = _int(env, "SLURM_LOCALID", 0) if local is None else local
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
            raise ValueError(f"init_process_group: {missing} is not set but "
                             f"{'WORLD_SIZE' if missing == 'RANK' else 'RANK'} is. Set both "
                             "(plus LOCAL_RANK, MASTER_ADDR, MASTER_PORT), or let `python -m minidist.launch "
                             "--nproc-per-node N script.py` set them.")
        rank = _int(env, "RANK")
        size = _int(env, "WORLD_SIZE", minimum=1)
        _check_rank("init_process_group", "RANK", rank, "WORLD_SIZE", size)
        port = _int(env, "MASTER_PORT", None, minimum=1)
        if port is not None and port > 65535:
            raise ValueError(f"MASTER_PORT={port} is not a TCP port; use 1..65535.")
        return LaunchInfo("torchrun", rank, size, _int(env, "LOCAL_RANK", 0),
                          env.get("MASTER_ADDR") or "127.0.0.1", port,
                          env.get("MINIDIST_LAUNCHER", ""))

    if "SLURM_PROCID" in env:
        rank = _int(env, "SLURM_PROCID")
        size = _int(env, "SLURM_NTASKS", None, minimum=1)
        _check_rank("slurm", "SLURM_PROCID", rank, "SLURM_NTASKS", size)
        return LaunchInfo("slurm", rank, size, _int(env, "SLURM_LOCALID", 0))

    return LaunchInfo("single", 0, 1, 0)


MPI_LAUNCHERS = ("openmpi", "hydra", "pmix", "slurm")


def default_backend(info: LaunchInfo) -> str:
    """What ``backend="auto"`` picks for this launch: "mpi", "tcp" or "local"."""
    if info.launcher in MPI_LAUNCHERS:
        return "mpi"
    if info.launcher == "torchrun" or (info.launcher == "explicit" and info.world_size != 1):
        return "tcp"
    return "local"


def parse_init_method(init_method: str | None,
                      env: Mapping[str, str] | None = None) -> tuple[str | None, int | None]:
    """The rendezvous address of torch's ``init_method``: ``"env://"`` (or None) reads
    ``MASTER_ADDR``/``MASTER_PORT``; ``"tcp://host:port"`` names it. Returns (addr, port),
    each None where unknown.

        >>> parse_init_method("tcp://127.0.0.1:29500")
        ('127.0.0.1', 29500)

    Raises:
        ValueError: another scheme (``file://``), or a malformed address or port.
    """
    env = os.environ if env is None else env
    if init_method is None or init_method == "env://":
        port = _int(env, "MASTER_PORT", None, minimum=1)
        addr = env.get("MASTER_ADDR") or ("127.0.0.1" if port is not None else None)
    elif init_method.startswith("tcp://"):
        host, sep, raw_port = init_method[len("tcp://"):].rstrip("/").rpartition(":")
        if not sep or not host or not raw_port.isdigit():
            raise ValueError(f"init_method={init_method!r}: expected 'tcp://host:port', e.g. "
                             "'tcp://127.0.0.1:29500'.")
        addr, port = host.strip("[]"), int(raw_port)
    else:
        raise ValueError(f"init_method={init_method!r} is not supported: use 'env://' "
                         "(MASTER_ADDR/MASTER_PORT) or 'tcp://host:port'.")
    if port is not None and not 1 <= port <= 65535:
        raise ValueError(f"init_method={init_method!r}: port {port} is not a TCP port; use "
                         "1..65535.")
    return addr, port


def apply_init_args(info: LaunchInfo, init_method: str | None = None, world_size: int = -1,
                    rank: int = -1, env: Mapping[str, str] | None = None) -> LaunchInfo:
    """Combine the launcher's ``info`` with ``init_process_group``'s explicit arguments.

    An explicit ``rank``/``world_size`` (torch's default -1 means "from the environment")
    makes a single process a rank of an "explicit" launch; under a launcher it must agree with
    what the launcher says. ``init_method`` supplies the rendezvous address.

    Raises:
        ValueError: only one of rank/world_size given, values out of range, or disagreeing
            with the launcher (the message names both values).
    """
    addr, port = parse_init_method(init_method, env)
    if (rank < 0) != (world_size < 0):
        raise ValueError(f"init_process_group: rank={rank} and world_size={world_size}: pass "
                         "both (as torch's mp.spawn scripts do) or neither (read from the "
                         "launcher's environment).")
    launcher = info.launcher
    if rank >= 0:
        if world_size < 1 or rank >= world_size:
            raise ValueError(f"init_process_group: rank={rank} must be in [0, {world_size}) "
                             f"(world_size={world_size}).")
        agree = (info.rank, info.world_size or world_size) == (rank, world_size)
        if info.started_by == "spawn" and not agree:
            # torch's mp.spawn sets no rank variables, so a script that passes its own (the
            # multi-node form of torch's imagenet example) means them: the arguments win.
            log.info("init_process_group: rank=%d, world_size=%d from the arguments (spawn "
                     "started this process as rank %d of %s).", rank, world_size, info.rank,
                     info.world_size)
            launcher = "single"
        elif launcher != "single" and not agree:
            raise ValueError(
                f"init_process_group: rank={rank}, world_size={world_size} but the launcher "
                f"({launcher_name(info)}) says rank={info.rank}, world_size={info.world_size}. "
                "Pass the launcher's values, or neither (they are read from the environment).")
        if launcher == "single":
            launcher = "explicit"
    return dataclasses.replace(
        info, launcher=launcher, rank=info.rank if rank < 0 else rank,
        world_size=info.world_size if world_size < 0 else world_size,
        master_addr=addr if addr is not None else info.master_addr,
        master_port=port if port is not None else info.master_port)


def warn_if_single(info: LaunchInfo) -> None:
    """Log the single-process warning once per call site (init_process_group calls it)."""
    if info.launcher == "single":
        log.warning("no launcher detected (no OMPI_*/PMI_*/PMIX_*/RANK/SLURM_* variables): "
                    "running as a single process. Use `./mpirun.sh -n 4 python ...` or "
                    "`python -m minidist.launch --nproc-per-node 4 ...` for several ranks.")


# ---------------------------------------------------------------- what this process can see

LOCAL_SIZE_VARS = ("LOCAL_WORLD_SIZE", "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE",
                   "SLURM_NTASKS_PER_NODE")


def ranks_on_this_node(world_size: int, env: Mapping[str, str] | None = None) -> int:
    """The ranks of the job on this node: ``LOCAL_WORLD_SIZE`` (torchrun, minidist.launch),
    ``MPI_LOCALNRANKS`` (MPICH), ``OMPI_COMM_WORLD_LOCAL_SIZE`` (Open MPI),
    ``SLURM_NTASKS_PER_NODE``, else ``world_size`` (one node assumed)."""
    env = os.environ if env is None else env
    for name in LOCAL_SIZE_VARS:
        value = str(env.get(name, "")).strip()
        if value.isdigit() and int(value) >= 1:
            return int(value)
    return max(int(world_size), 1)


def available_cores() -> int:
    """The cores this process may run on: its CPU affinity (what ``taskset``, a launcher's
    binding or a container's cpuset allow), else ``os.cpu_count()``."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except (AttributeError, OSError):  # no affinity call here (macOS)
        return os.cpu_count() or 1


def cores_per_rank(local_ranks: int, cores: int | None = None,
                   machine_cores: int | None = None) -> float:
    """How many cores each of the ``local_ranks`` ranks of this node can count on. A process
    pinned to fewer cores than the machine has (a launcher's binding) owns them; otherwise the
    ranks share the cores this process may run on. Below 1: more ranks than cores."""
    cores = available_cores() if cores is None else cores
    machine = (os.cpu_count() or cores) if machine_cores is None else machine_cores
    if cores < machine:
        return float(cores)
    return cores / max(int(local_ranks), 1)
