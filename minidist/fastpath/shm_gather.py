"""Shared-memory all-gather: every rank's part of a buffer, to every rank of one node.

    shm_all_gather(mpi_transport, buf, bounds)   # rank r fills buf[bounds[r]:bounds[r+1]]

Through the shared-memory all-reduce's double-buffered scratch window (shm.py)::

    slots:  rank 0 [ a0 |    |    ]   (1) write my part into my slot
            rank 1 [    | b1 |    ]   (2) barrier
            rank 2 [    |    | c2 ]   (3) copy every other part out of its owner's slot

The hierarchical all-reduce (hier.py) uses it for its last step on each node.
"""

from __future__ import annotations

import numpy as np

from minidist.fastpath.shm import scratch_window
from minidist.comm.transports.base import Transport
from minidist.fastpath.shm_window import shm_node


def shm_all_gather(transport: Transport, buf: np.ndarray, bounds: list) -> None:
    """Every rank r contributes ``buf[bounds[r]:bounds[r+1]]``; afterwards all hold all of them.

    Through the double-buffered scratch window: write my part into my slot, one barrier, copy
    the others' parts out of their slots (the next call uses the other half, so a fast rank
    never overwrites a part a slow one still reads). Collective over the transport's node;
    stream 0 only, like ``shm_all_reduce`` (hier's step (3)).
    """
    node = shm_node(transport)
    me = node.rank
    slots = scratch_window(node, buf.nbytes).slots(node.half, buf.dtype, buf.size)
    slots[me][bounds[me]:bounds[me + 1]] = buf[bounds[me]:bounds[me + 1]]
    node.barrier("all_gather(shm)")
    for j, slot in enumerate(slots):
        if j != me:
            buf[bounds[j]:bounds[j + 1]] = slot[bounds[j]:bounds[j + 1]]
    node.half ^= 1


__all__ = ["shm_all_gather"]
