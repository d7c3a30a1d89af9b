"""All-reduce algorithms, one per module, each seeing only a Transport.

    from minidist.comm.algorithms import ALGORITHMS
    ALGORITHMS["ring"](transport, buf, ReduceOp.SUM)   # in place on a 1-D contiguous array

``ALGORITHMS`` is the registry (name -> function); another algorithm joins by adding one entry
(and a cost formula in ``select.COST`` if "auto" may pick it). Which one runs for a call
("auto" resolved, with the calibration) is the planner's answer: ``minidist.comm.planner``.
"""

from __future__ import annotations

from typing import Callable

from minidist.comm.algorithms.cuda_ipc import (cuda_ipc_all_reduce, cuda_ipc_available,
                                               ipc_host_all_reduce)
from minidist.comm.algorithms.direct import direct_all_reduce
from minidist.comm.algorithms.hier import hier_all_reduce
from minidist.comm.algorithms.host_copy import host_copy_all_reduce
from minidist.comm.algorithms.mpi_native import mpi_all_reduce
from minidist.comm.algorithms.recursive_doubling import rd_all_reduce
from minidist.comm.algorithms.ring import ring_all_gather, ring_all_reduce, ring_reduce_scatter
from minidist.comm.algorithms.shm import shm_all_reduce
from minidist.comm.algorithms.tree import tree_all_reduce, tree_broadcast, tree_reduce

ALGORITHMS: dict[str, Callable[..., None]] = {
    "direct": direct_all_reduce,
    "ring": ring_all_reduce,
    "tree": tree_all_reduce,
    "rd": rd_all_reduce,
    "mpi": mpi_all_reduce,
    "shm": shm_all_reduce,
    "hier": hier_all_reduce,
    "cuda_ipc": cuda_ipc_all_reduce,
    "ipc_host": ipc_host_all_reduce,  # cuda_ipc's protocol on host windows: its CPU twin
    "host_copy": host_copy_all_reduce,  # small device buffers: down, host all-reduce, up
}


__all__ = ["ALGORITHMS", "direct_all_reduce", "ring_all_reduce", "tree_all_reduce",
           "rd_all_reduce", "mpi_all_reduce", "shm_all_reduce", "hier_all_reduce",
           "cuda_ipc_all_reduce", "cuda_ipc_available", "ipc_host_all_reduce", "host_copy_all_reduce",
           "ring_reduce_scatter", "ring_all_gather",
           "tree_reduce", "tree_broadcast"]
