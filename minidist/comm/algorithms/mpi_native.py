"""MPI's own all-reduce (algorithm "mpi"): the baseline every benchmark shows beside ours.

    mpi_all_reduce(transport, buf, ReduceOp.SUM)   # = MPI_Iallreduce(MPI_IN_PLACE, buf, ...)

It only exists on the MPI transport (``transport.native_all_reduce``); elsewhere it raises a
ValueError before anything is sent. MPI picks its own algorithm inside (MPICH: recursive
doubling for small messages, Rabenseifner or ring for large ones). The call is non-blocking
and waited with the transport's deadline; ``tag`` carries the call's fingerprint, which the
transport checks across ranks beside the reduction (MPI collectives have no tags).
"""

from __future__ import annotations

from typing import Any

from minidist.comm.ops import ReduceOp
from minidist.comm.transports.base import Transport


def supports_native(transport: Transport) -> bool:
    """True when the transport can run MPI's own Allreduce."""
    return transport.has_native_all_reduce


def mpi_all_reduce(transport: Transport, buf: Any, op: ReduceOp, tag: int = 0) -> None:
    """All-reduce ``buf`` in place with MPI's Iallreduce; ``tag``'s fingerprint is guarded."""
    if not supports_native(transport):
        raise ValueError(
            f"[rank {transport.rank}/{transport.size}] all_reduce(algorithm=\"mpi\"): the "
            f"{transport.name!r} transport has no MPI Allreduce. Use algorithm='ring', 'tree', "
            "'rd', 'direct' or 'auto', or run with backend='mpi' under mpiexec.")
    transport.native_all_reduce(buf, op, tag)
