"""All-reduce algorithms, one per module, each seeing only a Transport, and their registry.

    from minidist.comm.algorithms import ALGORITHMS
    ALGORITHMS["ring"](transport, buf, ReduceOp.SUM)   # in place on a 1-D contiguous array
    ALGORITHMS["shm"].usable(transport, buf, 0)        # may "auto" pick it for this call?

``ALGORITHMS`` is the registry: name -> ``Algorithm`` entry (registry.py: the function, its
cost model, the ``usable(transport, buffer, stream)`` capability check, and whether "auto" may
weigh it). Each module ends with its own entry; the planner, ``select``, ``calibrate`` and
``tune`` loop over this dict, so an algorithm that "auto" may choose joins by one new module
plus its line below. Which one runs for a call ("auto" resolved, with the calibration) is the
planner's answer: ``minidist.comm.planner``.
"""

from __future__ import annotations

from minidist.comm.algorithms.cuda_ipc import (CUDA_IPC, IPC_HOST, cuda_ipc_all_reduce,
                                               cuda_ipc_available, ipc_host_all_reduce)
from minidist.comm.algorithms.direct import DIRECT, direct_all_reduce
from minidist.comm.algorithms.hier import HIER, hier_all_reduce
from minidist.comm.algorithms.host_copy import HOST_COPY, host_copy_all_reduce
from minidist.comm.algorithms.mpi_native import MPI, mpi_all_reduce
from minidist.comm.algorithms.recursive_doubling import RD, rd_all_reduce
from minidist.comm.algorithms.registry import Algorithm
from minidist.comm.algorithms.ring import RING, ring_all_gather, ring_all_reduce, \
    ring_reduce_scatter
from minidist.comm.algorithms.shm import SHM, shm_all_reduce
from minidist.comm.algorithms.tree import TREE, tree_all_reduce, tree_broadcast, tree_reduce

# Registry order is "auto"'s order for preferred entries and its tie order for the model.
ALGORITHMS: dict[str, Algorithm] = {a.name: a for a in (
    DIRECT, RING, TREE, RD, MPI, SHM, HIER, CUDA_IPC, HOST_COPY, IPC_HOST,
)}


__all__ = ["ALGORITHMS", "Algorithm", "direct_all_reduce", "ring_all_reduce", "tree_all_reduce",
           "rd_all_reduce", "mpi_all_reduce", "shm_all_reduce", "hier_all_reduce",
           "cuda_ipc_all_reduce", "cuda_ipc_available", "ipc_host_all_reduce",
           "host_copy_all_reduce",
           "ring_reduce_scatter", "ring_all_gather",
           "tree_reduce", "tree_broadcast"]
