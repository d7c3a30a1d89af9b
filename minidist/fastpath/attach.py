"""How the fast-path wing attaches to the spine: through its seams, and nothing else.

    import minidist.fastpath          # runs attach() once (the root loads it unless
                                      # MINIDIST_WINGS leaves it out)

    the algorithm registry   register(MPI, SHM, HIER, CUDA_IPC, HOST_COPY, IPC_HOST), in that
                             order on every rank (comm/algorithms/__init__.py)
    group extensions         FastPathExtension: the node's shared memory for every new group
                             whose ranks share one node over MPI (collective), and the IPC
                             windows freed before the transport closes (comm/group.py)
    the planner's stagers    stager_for: device buffers over an MPI that is not CUDA-aware
                             (comm/planner.py ``STAGERS``)
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from minidist.comm import group as group_module
from minidist.comm import planner
from minidist.comm.algorithms import register
from minidist.fastpath.cuda_ipc import CUDA_IPC, IPC_HOST, close_ipc
from minidist.fastpath.hier import HIER
from minidist.fastpath.host_copy import HOST_COPY
from minidist.fastpath.mpi_native import MPI
from minidist.fastpath.shm import SHM, reduced_finite, shm_available, shm_node
from minidist.fastpath.shm_window import ShmNode, shm_alloc_buffer, shm_free_buffer
from minidist.fastpath.staging import stager_for


class SharedMemory:
    """``group.shared_memory``: what the spine may ask of the node's shared windows."""

    def __init__(self, transport: Any, node: ShmNode) -> None:
        self.transport = transport
        self.node = node
        # reduced_finite(buf): the NaN/inf verdict the shared-memory all-reduce found while it
        # reduced ``buf`` in place (True, False: "maybe"), or None (see shm.reduced_finite)
        self.reduced_finite = functools.partial(reduced_finite, node)

    def alloc_buffer(self, numel: int, dtype: Any) -> np.ndarray:
        """A 1-D array in a shared window (collective: every rank, same numel and dtype)."""
        return shm_alloc_buffer(self.transport, numel, dtype)

    def free_buffer(self, buf: Any) -> bool:
        """Free ``buf``'s window (collective); False if it is not in one."""
        return shm_free_buffer(self.transport, buf)

    def native_ahead(self, peer: int) -> int:
        """The MPI call number ``peer`` posted beyond this rank's (the guard lines)."""
        return self.node.guard.ahead(peer)


class FastPathExtension:
    """This wing on one group (see the module docstring)."""

    def __init__(self, group: Any) -> None:
        self.transport = group.transport
        if group.topology.is_single_node() and shm_available(group.transport):  # collective
            node = shm_node(group.transport)
            group.shared_memory = SharedMemory(group.transport, node)
            group.planner.shared_bases = node.owners  # may "auto" reduce a buffer in place?

    def farewell(self) -> None:
        """Nothing to compare."""

    def close(self) -> None:
        """Free the IPC windows (collective), before the transport closes."""
        close_ipc(self.transport)


_ATTACHED = False


def attach() -> None:
    """Register this wing's algorithms, group extension and stager (once per process)."""
    global _ATTACHED
    if _ATTACHED:
        return
    _ATTACHED = True
    for entry in (MPI, SHM, HIER, CUDA_IPC, HOST_COPY, IPC_HOST):
        register(entry)
    group_module.GROUP_EXTENSIONS.append(FastPathExtension)
    planner.STAGERS.append(stager_for)


__all__ = ["SharedMemory", "FastPathExtension", "attach"]
