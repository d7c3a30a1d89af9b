"""All-reduce algorithms, one per module, each seeing only a Transport, and their registry.

    from minidist.comm.algorithms import ALGORITHMS
    ALGORITHMS["ring"](transport, buf, ReduceOp.SUM)   # in place on a 1-D contiguous array
    ALGORITHMS["ring"].usable(transport, buf, 0)       # may "auto" pick it for this call?

``ALGORITHMS`` is the registry: name -> ``Algorithm`` entry (registry.py: the function, its
cost model, the ``usable(transport, buffer, stream)`` capability check, and whether "auto" may
weigh it). The spine holds the four textbook algorithms, each a module of this folder ending
with its entry::

    direct   every rank sends its buffer to every other        (the oracle)
    ring     reduce-scatter then all-gather around a ring      (bandwidth)
    tree     reduce up a binary tree, broadcast down           (latency, any n)
    rd       recursive doubling: log2(n) pairwise exchanges    (latency)

A wing adds its own entries with ``register`` when it is loaded (minidist/fastpath: "mpi",
"shm", "hier", "cuda_ipc", ...), in a fixed order, so the registry is the same on every rank.
The planner, ``auto`` and ``tune`` loop over this dict; ``on_register`` lets a wing that keeps
its own tables per algorithm (auto's cost model) hear of entries added after it loaded.
Which one runs for a call is the planner's answer: ``minidist.comm.planner``.
"""

from __future__ import annotations

from typing import Callable

from minidist.comm.algorithms.direct import DIRECT, direct_all_reduce
from minidist.comm.algorithms.recursive_doubling import RD, rd_all_reduce
from minidist.comm.algorithms.registry import Algorithm
from minidist.comm.algorithms.ring import RING, ring_all_gather, ring_all_reduce, \
    ring_reduce_scatter
from minidist.comm.algorithms.tree import TREE, tree_all_reduce, tree_broadcast, tree_reduce

# Registry order is "auto"'s order for preferred entries and its tie order for the model.
ALGORITHMS: dict[str, Algorithm] = {a.name: a for a in (DIRECT, RING, TREE, RD)}
_LISTENERS: list[Callable[[Algorithm], None]] = []


def register(algorithm: Algorithm) -> None:
    """Add ``algorithm`` to ``ALGORITHMS`` (or replace the entry of its name), and tell the
    ``on_register`` listeners."""
    ALGORITHMS[algorithm.name] = algorithm
    for listener in _LISTENERS:
        listener(algorithm)


def on_register(listener: Callable[[Algorithm], None]) -> None:
    """Call ``listener(entry)`` for every entry ``register`` adds from now on."""
    _LISTENERS.append(listener)


__all__ = ["ALGORITHMS", "Algorithm", "register", "on_register", "direct_all_reduce",
           "ring_all_reduce", "tree_all_reduce", "rd_all_reduce", "ring_reduce_scatter",
           "ring_all_gather", "tree_reduce", "tree_broadcast"]
