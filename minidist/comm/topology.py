"""Topology: which ranks share a node, and this rank's place among them.

    topo = group.topology            # built (collectively) when the ProcessGroup is made
    topo.node_rank, topo.local_rank  # my node's index, my index on it
    topo.local_world_size            # ranks on my node
    topo.nodes                       # ((0, 1), (2, 3)): the ranks of every node, in rank order
    topo.ranks_of_node(1)            # (2, 3)

How a rank finds its node (``detect_topology``):

- MPI: ``MPI_Comm_split_type(COMM_TYPE_SHARED)``, i.e. the ranks MPI says share memory;
- TCP: a hash of the host name, all-gathered over the transport;
- threads, local: every rank is in this process, one node (no messages);
- ``MINIDIST_RANKS_PER_NODE=k`` (every rank the same k): virtual nodes of k consecutive ranks
  (by ``COMM_WORLD`` rank) inside each real node, so the multi-node code paths run on one
  machine. 5 ranks with k=2 are nodes (0, 1), (2, 3), (4,)::

      machine:        [ r0 r1 r2 r3 r4 ]          one real node
      virtual nodes:  [ r0 r1 ][ r2 r3 ][ r4 ]    node_rank 0, 1, 2; local_rank 0, 1 | 0, 1 | 0

Between virtual nodes the collectives take the network path (point-to-point messages: MPI or
TCP), never shared memory; ``shm`` runs only in a group whose ranks all sit on one node.
Nodes are numbered in order of their lowest rank, and local ranks in rank order, so every rank
computes the same ``Topology`` from the same table.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np

from minidist.comm.errors import CommError
from minidist.comm.transports.base import Transport, host_machine_key, set_peer_nodes
from minidist.envvars import env

ENV = "MINIDIST_RANKS_PER_NODE"


@dataclass(frozen=True)
class Topology:
    """The node of every rank of a group, and this rank's place in it.

    Args:
        rank: this rank (in the group).
        node_of: ``node_of[r]`` is the node index of rank ``r`` (nodes numbered by lowest rank).
        virtual: the nodes come from ``MINIDIST_RANKS_PER_NODE``, not from the machines.

    Example:
        >>> t = Topology(rank=3, node_of=(0, 0, 1, 1, 2))
        >>> t.node_rank, t.local_rank, t.local_world_size, t.num_nodes
        (1, 1, 2, 3)
        >>> t.nodes
        ((0, 1), (2, 3), (4,))
    """

    rank: int
    node_of: tuple
    virtual: bool = False

    @property
    def size(self) -> int:
        """Ranks in the group."""
        return len(self.node_of)

    @property
    def nodes(self) -> tuple:
        """The ranks of every node, ``nodes[i]`` in rank order."""
        out: list[list[int]] = [[] for _ in range(self.num_nodes)]
        for r, n in enumerate(self.node_of):
            out[n].append(r)
        return tuple(tuple(x) for x in out)

    @property
    def num_nodes(self) -> int:
        """How many nodes the group spans."""
        return max(self.node_of) + 1

    @property
    def node_rank(self) -> int:
        """The index of this rank's node."""
        return self.node_of[self.rank]

    @property
    def local_rank(self) -> int:
        """This rank's index among the ranks of its node."""
        return self.node_of[:self.rank].count(self.node_rank)

    @property
    def local_world_size(self) -> int:
        """How many ranks share this rank's node."""
        return self.node_of.count(self.node_rank)

    def ranks_of_node(self, node: int) -> tuple:
        """The ranks of node ``node``, in rank order."""
        if not 0 <= node < self.num_nodes:
            raise ValueError(f"[rank {self.rank}/{self.size}] ranks_of_node({node}): there are "
                             f"{self.num_nodes} nodes; pass 0 <= node < {self.num_nodes}.")
        return self.nodes[node]

    def is_single_node(self) -> bool:
        """True when every rank shares one node (shared memory may be used by all)."""
        return self.num_nodes == 1


def ranks_per_node() -> int | None:
    """``MINIDIST_RANKS_PER_NODE`` as a positive int, or None when unset/empty.

    Raises:
        ValueError: not a positive integer (says what to set).
    """
    k: int | None = env(ENV)
    return k


def number_nodes(keys: list) -> tuple:
    """Node index per rank from any hashable key per rank (numbered by first appearance)."""
    index: dict = {}
    return tuple(index.setdefault(k, len(index)) for k in keys)


def _all_gather_rows(transport: Transport, table: np.ndarray) -> None:
    """Ring all-gather of one row per rank (tag 0; runs before the group takes messages)."""
    n, r = transport.size, transport.rank
    for s in range(n - 1):
        transport.sendrecv(table[(r - s) % n], (r + 1) % n, table[(r - s - 1) % n], (r - 1) % n, 0)


_CACHE: "weakref.WeakKeyDictionary[Transport, Topology]" = weakref.WeakKeyDictionary()


def detect_topology(transport: Transport) -> Topology:
    """The transport's Topology, found on first use (collective then), cached afterwards.

    MPI and TCP exchange 3 integers per rank (machine key, world rank, ``k``) with a ring
    all-gather on message tag 0 before any collective runs; threads and local send nothing.

    Raises:
        ValueError: ``MINIDIST_RANKS_PER_NODE`` is not a positive integer.
        CommError: ranks were started with different ``MINIDIST_RANKS_PER_NODE``.
    """
    topo = _CACHE.get(transport)
    if topo is not None:
        return topo
    k = ranks_per_node()
    n = transport.size
    if transport.one_process or n == 1:
        table = np.array([[0, r, k or 0] for r in range(n)], np.int64)
    else:
        table = np.zeros((n, 3), np.int64)
        mpi = transport.mpi
        table[transport.rank] = ((mpi.machine_key(), mpi.world_rank, k or 0) if mpi is not None
                                 else (host_machine_key(), transport.rank, k or 0))
        _all_gather_rows(transport, table)
        ks = sorted(set(table[:, 2].tolist()))
        if len(ks) > 1:
            raise CommError(f"[rank {transport.rank}/{n}] topology: the ranks were started with "
                            f"different {ENV} ({ks}; 0 = unset). Set the same value on every "
                            "rank, or unset it everywhere.")
    # a virtual node is k consecutive world ranks inside one machine
    keys = [(int(machine), int(world) // k if k else 0) for machine, world, _ in table]
    topo = Topology(transport.rank, number_nodes(keys), virtual=bool(k))
    _CACHE[transport] = topo
    set_peer_nodes(transport, list(topo.node_of))
    return topo


def topology_of(transport: Transport) -> Topology | None:
    """The Topology already found for ``transport`` (``detect_topology``), or None."""
    return _CACHE.get(transport)


__all__ = ["Topology", "detect_topology", "topology_of", "ranks_per_node", "number_nodes", "ENV"]
