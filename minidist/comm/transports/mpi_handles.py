"""What MPI-only code reaches through an MPI transport (``transport.mpi``: ``MPIHandles``),
and how the MPI transport passes device (CuPy) buffers.

    t.mpi.comm, t.mpi.MPI                # MPI's own Allreduce (minidist/fastpath/mpi_native.py)
    t.mpi.machine_key()                  # which ranks share memory (minidist.comm.topology)
    t.mpi.split_by_color(color, key)     # node transports of the "hier" algorithm

Each collective here first waits for every rank with an ``Ibarrier`` and the transport's
deadline (``wait_local``), so a missing rank is a CommTimeout, not a hang inside MPI.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from minidist import xp as backend
from minidist.comm.errors import CommTimeout
from minidist.comm.transports.base import wait_until
from minidist.comm.transports.mpi_library import mpi_cuda_aware
from minidist.envvars import env, raw
from minidist.logger import get_logger

log = get_logger("minidist.comm.transports.mpi")  # its lines keep the transport's name


@dataclass
class MPIHandles:
    """What MPI-only code needs of an MPI transport (``transport.mpi``; None elsewhere).

    Attributes:
        MPI: the ``mpi4py.MPI`` module.
        comm: the communicator of data messages and MPI's own collectives (a duplicate of
            ``COMM_WORLD`` or of the communicator given); shared-memory windows split it.
        side: the communicator of the side channel (failure notices, farewells).
        guard_node: the shared-memory node whose guard lines check MPI's Allreduce
            fingerprints when every rank shares one node (shm_window.py), else None.
        host_view: ``host_view(buf, for_recv) -> (array MPI sees, copy-back or None)``.
        machine_key: ``machine_key()``: ``COMM_WORLD`` rank of the lowest rank sharing my
            memory (collective; topology.py).
        split_by_color: ``split_by_color(color, key)``: an MPITransport over an
            ``MPI_Comm_split`` (collective; the "hier" algorithm's node transports).
        world_rank: this rank in ``COMM_WORLD`` (a sub-communicator's rank differs).
        spin_tests: ``Test()`` calls before a wait starts yielding the core.
    """

    MPI: Any
    comm: Any
    side: Any
    host_view: Any
    machine_key: Any
    split_by_color: Any
    world_rank: int
    spin_tests: int
    guard_node: Any = None  # the ShmNode when every rank shares one node (shm_window.py)


def wait_local(req: Any, timeout_s: float, what: str) -> None:
    """Wait for an MPI request with a deadline but no side channel (it may not exist yet)."""
    def timed_out() -> CommTimeout:
        return CommTimeout(f"{what}: not every rank of the MPI job arrived within {timeout_s:g} "
                           "s. Start every rank with the same program, or raise "
                           "MINIDIST_TIMEOUT_S.")
    wait_until(req.Test, timeout_s, timed_out)


def machine_key(t: Any) -> int:
    """``COMM_WORLD`` rank of the lowest rank sharing my memory (``MPI_Comm_split_type``).

    Collective over the transport ``t``'s communicator (waited with its deadline first).
    """
    MPI = t.MPI
    wait_local(t.comm.Ibarrier(), t.timeout_s, f"[rank {t.rank}/{t.size}] topology")
    node = t.comm.Split_type(MPI.COMM_TYPE_SHARED, key=t.rank)
    try:
        leader = MPI.Group.Translate_ranks(node.Get_group(), [0], MPI.COMM_WORLD.Get_group())
    finally:
        node.Free()
    return int(leader[0])


def split_by_color(t: Any, color: int, key: int) -> Any:
    """``MPI_Comm_split`` of ``t``'s communicator (after an Ibarrier with the deadline): a
    transport of ``t``'s type over the ranks with the same ``color``."""
    wait_local(t.comm.Ibarrier(), t.timeout_s, f"[rank {t.rank}/{t.size}] split")
    sub = t.comm.Split(color, key)
    try:
        return type(t)(sub, t.timeout_s)
    finally:
        sub.Free()  # the new transport made its own duplicates


def split_members(t: Any, members: list[int], timeout_s: float) -> Any:
    """``Transport.split`` on MPI: a transport over an ``MPI_Comm_split`` of ``t``'s
    communicator (collective over every rank; None on ranks outside ``members``)."""
    color = 0 if t.rank in members else t.MPI.UNDEFINED
    key = members.index(t.rank) if t.rank in members else 0
    sub = t.comm.Split(color, key)
    return None if t.rank not in members else type(t)(sub, timeout_s)


def decide_cuda_aware(rank: int) -> bool:
    """Whether device buffers go to MPI directly: ``MINIDIST_CUDA_AWARE_MPI`` (1, 0, or auto:
    ``mpi_cuda_aware()``'s probe, unknown -> no); logged once, on rank 0."""
    forced = env("MINIDIST_CUDA_AWARE_MPI")
    probed = mpi_cuda_aware() if forced is None else None
    direct = bool(forced) if forced is not None else probed is True
    if rank == 0:
        log.info("GPU buffers: %s (MINIDIST_CUDA_AWARE_MPI=%s, probe=%s)",
                 "passed to MPI directly" if direct else "staged through host",
                 raw("MINIDIST_CUDA_AWARE_MPI") or "auto", probed)
    return direct


def host_view(t: Any, buf: Any, for_recv: bool) -> tuple:
    """(array MPI sees, callback after completion or None) for a numpy or cupy buffer: a
    device buffer is synchronized first, and copied through host memory unless the transport
    ``t`` is CUDA-aware."""
    if not backend.is_device_array(buf):
        return buf, None
    backend.synchronize(buf)
    if t.cuda_aware():
        return buf, None
    host = backend.to_host(buf)
    if not for_recv:
        return host, None

    def copy_back() -> None:
        buf.set(host) if hasattr(buf, "set") else buf.__setitem__(Ellipsis, host)
    return host, copy_back
