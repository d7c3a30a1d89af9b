"""Which transport a backend name runs, and building it: ``init_process_group``'s choices.

    transport = make_transport("mpi", info, timeout_s)   # "mpi" | "local" | a wing's ("tcp")
    torch_backend_note("gloo", "mpi", info)              # one line: what a torch name runs as

torch's names map onto minidist's transports (``TORCH_BACKENDS``): ``gloo`` is the TCP
transport (under mpiexec/srun with no MASTER_PORT, the MPI transport, said at INFO);
``nccl`` is the GPU path over whatever transport the launcher implies.
"""

from __future__ import annotations

from typing import Callable

from minidist import logger as mdlog
from minidist.comm.env import LaunchInfo
from minidist.comm.transports.base import Transport

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
    factory = TRANSPORTS.get(backend)
    if factory is None:
        raise ValueError(f"init_process_group(backend={backend!r}): the {backend} transport "
                         f"belongs to a wing that MINIDIST_WINGS leaves out (unset "
                         f"MINIDIST_WINGS, or add {backend} to it), or use backend='mpi' under "
                         "mpiexec.")
    return factory(info, timeout_s)


# More transports, by backend name: a wing adds ``factory(info, timeout_s) -> Transport`` here
# when it loads (minidist/tcp: "tcp").
TRANSPORTS: dict[str, Callable[[LaunchInfo, float], Transport]] = {}


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
