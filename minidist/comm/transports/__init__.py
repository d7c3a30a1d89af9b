"""Transports: how bytes move between ranks (see base.py for the interface).

    local.LocalTransport     one rank, no messages
    threads.ThreadTransport  N ranks as threads of one process (tests); run_threads(n, fn)
    mpi.MPITransport         mpi4py point-to-point + MPI's own Allreduce (imported lazily)
    tcp.TCPTransport         sockets, for torchrun-style launches (imported lazily)

Only base, local and threads are imported here, so ``import minidist`` never loads MPI.
"""

from __future__ import annotations

from minidist.comm.transports.base import DEFAULT_TIMEOUT_S, Request, Transport
from minidist.comm.transports.local import LocalTransport
from minidist.comm.transports.threads import ThreadTransport, ThreadWorld, run_threads

__all__ = ["DEFAULT_TIMEOUT_S", "Request", "Transport", "LocalTransport", "ThreadTransport",
           "ThreadWorld", "run_threads"]
