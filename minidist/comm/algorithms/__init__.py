"""All-reduce algorithms, one per module, each seeing only a Transport.

    from minidist.comm.algorithms import ALGORITHMS, resolve
    name, fn, why = resolve("auto", transport, buf)   # e.g. "ring", ring_all_reduce, its reason
    fn(transport, buf, ReduceOp.SUM)          # in place on a 1-D contiguous array

``ALGORITHMS`` is the registry (name -> function); another algorithm joins by adding one entry
(and a cost formula in ``select.COST`` if "auto" may pick it).
"""

from __future__ import annotations

from typing import Any, Callable

from minidist.comm.algorithms.cuda_ipc import cuda_ipc_all_reduce, cuda_ipc_available
from minidist.comm.algorithms.direct import direct_all_reduce
from minidist.comm.algorithms.hier import hier_all_reduce
from minidist.comm.algorithms.mpi_native import mpi_all_reduce, supports_native
from minidist.comm.algorithms.recursive_doubling import rd_all_reduce
from minidist.comm.algorithms.ring import ring_all_gather, ring_all_reduce, ring_reduce_scatter
from minidist.comm.algorithms.select import choose_for_nodes, choose_with_reason
from minidist.comm.algorithms.shm import shm_all_reduce, shm_available, shm_is_shared
from minidist.comm.algorithms.tree import tree_all_reduce, tree_broadcast, tree_reduce
from minidist.comm.topology import detect_topology
from minidist.comm.transports.base import Transport

ALGORITHMS: dict[str, Callable[..., None]] = {
    "direct": direct_all_reduce,
    "ring": ring_all_reduce,
    "tree": tree_all_reduce,
    "rd": rd_all_reduce,
    "mpi": mpi_all_reduce,
    "shm": shm_all_reduce,
    "hier": hier_all_reduce,
    "cuda_ipc": cuda_ipc_all_reduce,
}


def resolve(name: str, transport: Transport, buf: Any) -> tuple:
    """``(name, function, reason)`` for ``name`` ("auto": the rules and model of select.py).

    Raises:
        ValueError: for an unknown name (the caller adds the rank prefix).
    """
    reason = "explicit"
    if name == "auto":
        by_nodes = choose_for_nodes(detect_topology(transport).num_nodes, buf.nbytes)
        if by_nodes is not None:
            return by_nodes[0], ALGORITHMS[by_nodes[0]], by_nodes[1]
        has_shm = shm_available(transport, buf)  # collective the first time (all ranks resolve)
        name, reason = choose_with_reason(transport.size, buf.nbytes, supports_native(transport),
                                          has_shm, has_shm and shm_is_shared(transport, buf))
    fn = ALGORITHMS.get(name)
    if fn is None:
        raise ValueError(f"unknown algorithm {name!r}; use one of "
                         f"{', '.join(repr(k) for k in [*ALGORITHMS, 'auto'])}")
    return name, fn, reason


__all__ = ["ALGORITHMS", "resolve", "direct_all_reduce", "ring_all_reduce", "tree_all_reduce",
           "rd_all_reduce", "mpi_all_reduce", "shm_all_reduce", "hier_all_reduce",
           "cuda_ipc_all_reduce", "cuda_ipc_available",
           "ring_reduce_scatter", "ring_all_gather",
           "tree_reduce", "tree_broadcast"]
