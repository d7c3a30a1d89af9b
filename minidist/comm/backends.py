"""Which transport a backend name runs, and building it: ``init_process_group``'s choices.

    transport = make_transport("tcp", info, timeout_s)   # "mpi" | "tcp" | "local"
    port = rendezvous_port(info)                         # MASTER_PORT, or beside torchrun's
    torch_backend_note("gloo", "mpi", info)              # one line: what a torch name runs as

torch's names map onto minidist's transports (``TORCH_BACKENDS``): ``gloo`` is the TCP
transport (under mpiexec/srun with no MASTER_PORT, the MPI transport, said at INFO);
``nccl`` is the GPU path over whatever transport the launcher implies.
"""

from __future__ import annotations

import errno
import os
from typing import Any

from minidist import logger as mdlog
from minidist.comm.env import LaunchInfo
from minidist.comm.errors import CommError
from minidist.comm.transports.base import Transport
from minidist.envvars import env as env_var

log = mdlog.get_logger("minidist.comm.api")  # its lines keep the name users know

BACKENDS = ("auto", "mpi", "tcp", "local", "gloo", "nccl")
# torch's backend names, as minidist runs them: gloo is TCP; nccl is the GPU path (CuPy arrays)
# over whatever transport the launcher implies, since minidist has no NCCL of its own.
TORCH_BACKENDS = {"gloo": "tcp", "nccl": "auto"}


def make_transport(backend: str, info: LaunchInfo, timeout_s: float) -> Transport:
    if backend == "local":
        from minidist.comm.transports.local import LocalTransport
        return LocalTransport(timeout_s)
    if backend == "mpi":
        from minidist.comm.transports.mpi import MPITransport
        t = MPITransport(timeout_s=timeout_s)
        if info.launcher == "slurm" and info.world_size is not None and t.size != info.world_size:
            t.close()
            raise ValueError(
                f"[rank {info.rank}/{info.world_size}] init_process_group: srun started "
                f"{info.world_size} tasks but MPI sees {t.size}: srun served them no PMI, so "
                "each task is an MPI world of its own. Start them with `srun --mpi=pmi2` (srun "
                "--mpi=list shows the plugins) or over TCP (examples/slurm_job.sh tcp).")
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
    if info.world_size is None or info.master_port is None:
        raise ValueError("init_process_group(backend='tcp'): needs RANK, WORLD_SIZE, MASTER_ADDR "
                         "and MASTER_PORT in the environment (as torchrun and python -m "
                         "minidist.launch set them), or rank=, world_size= and "
                         "init_method='tcp://host:port'; "
                         f"detected launcher={info.launcher!r}, MASTER_PORT={info.master_port}.")
    port = rendezvous_port(info)
    try:
        return TCPTransport(info.rank, info.world_size, info.master_addr or "127.0.0.1", port,
                            timeout_s)
    except CommError as e:
        if port == info.master_port or getattr(e.__cause__, "errno", None) != errno.EADDRINUSE:
            raise
        why = ("MINIDIST_RENDEZVOUS_PORT" if env_var("MINIDIST_RENDEZVOUS_PORT") is not None
               else f"MASTER_PORT + 1, since torchrun's agent holds MASTER_PORT={info.master_port}")
        raise CommError(f"{mdlog.rank_prefix()} init_process_group: the TCP rendezvous needs port "
                        f"{port} ({why}), and another program is using it. Set "
                        "MINIDIST_RENDEZVOUS_PORT to a free port (the same on every rank), or "
                        "pick another MASTER_PORT.") from e


def rendezvous_port(info: LaunchInfo, env: Any = None) -> int:
    """The port of the TCP rendezvous: MASTER_PORT, or beside it under a real torchrun.

    torchrun's agent already serves its own store on MASTER_PORT (``TORCHELASTIC_RUN_ID`` is set
    in its ranks), so there minidist meets at MASTER_PORT + 1 on the same host instead;
    ``MINIDIST_RENDEZVOUS_PORT`` chooses the port explicitly (every rank must set the same).
    """
    env = os.environ if env is None else env
    explicit = env_var("MINIDIST_RENDEZVOUS_PORT", env)
    if explicit is not None:
        return int(explicit)
    if env.get("TORCHELASTIC_RUN_ID") and info.master_port is not None:
        port = info.master_port + 1
        if info.rank == 0:
            log.info("torchrun detected: its agent serves MASTER_PORT=%d, so the minidist "
                     "rendezvous uses port %d (set MINIDIST_RENDEZVOUS_PORT to choose another)",
                     info.master_port, port)
        return port
    if info.master_port is None:
        raise ValueError("init_process_group(backend='tcp'): MASTER_PORT is not set; set it to "
                         "the same free port on every rank (or pass init_method='tcp://host:port').")
    return int(info.master_port)


def torch_backend_note(backend: str, chosen: str, info: LaunchInfo) -> None:
    """Say in one line what a torch backend name runs as (see TORCH_BACKENDS).

    ``gloo`` under mpiexec/srun takes rank and size from the launcher and meets over TCP at
    MASTER_PORT (or ``init_method``); with no port given it runs on MPI, which the launcher
    already connected. That is the usual ported line under ``./mpirun.sh`` and works as the
    user meant, so rank 0 says it at INFO (``MINIDIST_LOG_LEVEL=INFO`` shows it). Only where
    the choice goes against the user's set-up, a ``MASTER_ADDR`` set for a TCP rendezvous
    without ``MASTER_PORT``, is it a warning, shown at the default level.
    """
    if backend == "gloo":
        if chosen == "mpi":
            if info.rank == 0 and info.master_addr:
                log.warning("backend='gloo' under %s: MASTER_ADDR=%s is set but MASTER_PORT is "
                            "not, so the TCP rendezvous is not used: running minidist's MPI "
                            "transport (the launcher already connected the ranks). Set "
                            "MASTER_PORT for TCP, or unset MASTER_ADDR", info.launcher,
                            info.master_addr)
            elif info.rank == 0:
                log.info("backend='gloo' under %s: running minidist's MPI transport (the "
                         "launcher already connected the ranks); under torchrun-style "
                         "variables gloo runs the TCP transport", info.launcher)
        else:
            log.info("backend='gloo': running minidist's TCP transport")
        return
    from minidist.xp import gpu_available
    if gpu_available():
        log.info("backend='nccl': minidist has no NCCL; GPU (CuPy) arrays are reduced over "
                 "the %s transport", chosen)
    else:
        log.warning("backend='nccl' on a machine without a usable GPU (no CuPy/CUDA): running "
                    "on the CPU over the %s transport; pass backend='gloo' or None to silence "
                    "this", chosen)
