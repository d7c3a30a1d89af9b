"""Hierarchical all-reduce (algorithm "hier"): each byte crosses the network once per node.

Two nodes of two ranks (a, b on node 0; c, d on node 1), buffer cut in k = 2 shards s0 | s1::

    node 0                     node 1
    a: [a0|a1]  b: [b0|b1]     c: [c0|c1]  d: [d0|d1]
     (1) reduce-scatter on each node: local rank l owns shard l of its node's sum
    a: [A0|  ]  b: [  |B1]     c: [C0|  ]  d: [  |D1]     A0 = a0+b0, B1 = a1+b1, ...
     (2) all-reduce shard l among the ranks with local rank l, one per node (over the network)
    a: [S0|  ]  <----------->  c: [S0|  ]                 S0 = A0+C0 (ring or rec. doubling)
                b: [  |S1]  <----------->  d: [  |S1]     S1 = B1+D1
     (3) all-gather on each node: every rank gets every shard
    a,b,c,d: [S0|S1]

Only phase (2) leaves the node, and each rank sends there the all-reduce traffic of a buffer
k times smaller: every rank sends 2(N-1)/N x K/k bytes between nodes (N nodes, k ranks per
node), a node 2(N-1)/N x K in all, spread over its k ranks. A flat ring over the N*k ranks
(consecutive ranks on a node) sends about as much per node, but all of it from the one rank
whose right neighbour is on the next node: 2(Nk-1)/(Nk) x K, (Nk-1)/(N-1) times hier's
per-rank load (about k on many nodes), in 2(Nk-1) network-latency steps instead of 2(N-1).
Tree, recursive doubling and a ring that interleaves nodes send the whole buffer across the
network from every rank.

Uneven nodes (5 ranks as 2+2+1): the buffer is cut into kmax = the largest node's size shards;
a node of k_m ranks gives local rank l the shards [l*kmax//k_m, (l+1)*kmax//k_m) (a node of
one rank owns them all), and shard j's phase-(2) group is the owner of j on every node. Each
rank runs its phase-(2) all-reduces in increasing j, so the lowest unfinished one always has all
its members present: no deadlock. Phases (1) and (3) use the node's shared window where there is
one (MPI, stream 0: ``node_transport``): (1) is then a ``shm`` all-reduce on the node (every rank
gets the node's sum; no messages) and (3) an all-gather through the window; elsewhere (TCP,
threads, other streams) they are rings over the node's ranks with the owners' regions as chunks.
Phase (2) runs recursive doubling below ``RD_MAX_BYTES`` (latency: log2 N steps) and the ring
above (bandwidth). A device (CuPy) buffer runs (1) and (3) over CUDA IPC on the node
(``cuda_ipc``: no host memory) and stages only (2) through pinned host memory
(``minidist.fastpath.staging``), when every node has 2-8 ranks in separate processes; otherwise
the whole all-reduce is staged. The sub-groups are rank-subset views of the transport
(``members``), so their messages go through the parent transport and its byte counters.

Cost (a, b, g: alpha, beta, gamma per level): intra 2(k-1)(a_i + K/k b_i) + ...; inter, ring:
2(N-1) a_n + 2(N-1)/N K/k b_n + (N-1)/N K/k g. Invariant: each shard is reduced on its node by
its owner (ring order), then across nodes by an algorithm whose result is identical on every
member, then copied: every rank ends with identical bits. AVG sums, then divides once by the
world size.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from minidist import xp as backend
from minidist.fastpath.cuda_ipc import MAX_RANKS, cuda_ipc_all_gather, \
    cuda_ipc_all_reduce, cuda_ipc_available
from minidist.comm.algorithms.recursive_doubling import rd_all_reduce
from minidist.comm.algorithms.registry import Algorithm
from minidist.comm.algorithms.ring import chunk_bounds, ring_all_reduce
from minidist.comm.algorithms.scratch import scratch
from minidist.fastpath.shm import shm_all_reduce, shm_available
from minidist.fastpath.shm_gather import shm_all_gather
from minidist.comm.ops import ReduceOp, combine, finalize
from minidist.fastpath.staging import stager_for
from minidist.comm.topology import Topology, detect_topology
from minidist.comm.transports.base import Request, Transport, stream_of

RD_MAX_BYTES = 64 << 10  # phase (2) shards below this run recursive doubling, else the ring


class Members(Transport):
    """A rank-subset view of a transport: rank i here is ``ranks[i]`` of ``parent``.

    Messages go through the parent (its tags, deadlines, poll hook and byte counters); only
    the rank numbers are translated. Use ``members(parent, ranks)``: views are cached, so the
    algorithms' scratch buffers (cached per transport) are reused across calls.
    """

    def __init__(self, parent: Transport, ranks: tuple) -> None:
        self.parent, self.ranks = parent, tuple(ranks)
        self.rank, self.size = self.ranks.index(parent.rank), len(self.ranks)
        self.name, self.max_tag = parent.name, parent.max_tag

    def isend(self, buf: Any, dst: int, tag: int = 0) -> Request:
        return self.parent.isend(buf, self.ranks[dst], tag)

    def irecv(self, buf: Any, src: int, tag: int = 0) -> Request:
        return self.parent.irecv(buf, self.ranks[src], tag)

    def sendrecv(self, sendbuf: Any, dst: int, recvbuf: Any, src: int, tag: int = 0,
                 timeout_s: float | None = None) -> None:
        self.parent.sendrecv(sendbuf, self.ranks[dst], recvbuf, self.ranks[src], tag, timeout_s)

    def alloc_buffer(self, numel: int, dtype: Any, xp: Any = None) -> Any:
        return self.parent.alloc_buffer(numel, dtype) if xp is None else \
            self.parent.alloc_buffer(numel, dtype, xp)

    def cuda_aware(self) -> bool:
        return self.parent.cuda_aware()


_VIEWS: "weakref.WeakKeyDictionary[Transport, dict]" = weakref.WeakKeyDictionary()


def members(parent: Transport, ranks: tuple) -> Members:
    """The cached ``Members`` view of ``ranks`` (which must include ``parent.rank``)."""
    views = _VIEWS.setdefault(parent, {})
    view = views.get(ranks)
    if view is None:
        view = views[ranks] = Members(parent, ranks)
    return view


_NODE: "weakref.WeakKeyDictionary[Transport, Any]" = weakref.WeakKeyDictionary()


def node_transport(transport: Transport, topo: Topology) -> Transport | None:
    """The transport of my node's ranks when it has a shared window, else None.

    Made on first use (collective over ``transport``: MPI's ``split_by_color`` by node, then
    the node's shared-memory set-up), cached afterwards. None where the transport has no
    sub-communicators (TCP, threads) or my node has one rank.
    """
    node = _NODE.get(transport, False)
    if node is False:
        sub = (transport.mpi.split_by_color(topo.node_rank, topo.local_rank)
               if transport.mpi is not None else None)
        node = sub if sub is not None and shm_available(sub) else None
        if node is not None:  # its waits watch the group's failure notices too
            parent = weakref.ref(transport)

            def poll(src: Any, tag: int) -> Any:
                t = parent()
                hook = None if t is None else t.poll_hook
                return None if hook is None else hook(None, tag)
            node.poll_hook = poll
        _NODE[transport] = node
    return node


class _Plan:
    """What one rank does for a message of ``numel`` elements on a topology (cached)."""

    def __init__(self, topo: Topology, numel: int) -> None:
        nodes = topo.nodes
        self.kmax = kmax = max(len(n) for n in nodes)
        self.shards = chunk_bounds(numel, kmax)  # shard j: [shards[j], shards[j + 1])
        local = nodes[topo.node_rank]
        k = len(local)
        # region of local rank l: shards [l*kmax//k, (l+1)*kmax//k) -> element bounds
        self.first = [i * kmax // k for i in range(k + 1)]
        self.region = [self.shards[f] for f in self.first]
        self.local = local
        me = topo.local_rank
        self.cross = []  # (shard j, its phase-(2) group) for every shard j I own, increasing j
        for j in range(self.first[me], self.first[me + 1]):
            group = tuple(n[_owner(j, kmax, len(n))] for n in nodes)
            self.cross.append((j, group))


def _owner(j: int, kmax: int, k: int) -> int:
    """The local rank that owns shard ``j`` on a node of ``k`` ranks (kmax shards)."""
    return next(i for i in range(k) if i * kmax // k <= j < (i + 1) * kmax // k)


_PLANS: dict = {}


def _plan(topo: Topology, numel: int) -> _Plan:
    key = (topo, numel)
    p = _PLANS.get(key)
    if p is None:
        if len(_PLANS) > 256:
            _PLANS.clear()
        p = _PLANS[key] = _Plan(topo, numel)
    return p


def _ring_reduce_scatter(t: Transport, buf: Any, b: list, op: ReduceOp, tag: int) -> None:
    """Ring reduce-scatter with chunk ``i = [b[i], b[i+1])``: rank i ends owning chunk i."""
    n, r = t.size, t.rank
    right, left = (r + 1) % n, (r - 1) % n
    incoming = scratch(t, buf, max(b[i + 1] - b[i] for i in range(n)), tag)
    for s in range(n - 1):
        sc, rc = (r - s - 1) % n, (r - s - 2) % n
        mine = buf[b[rc]:b[rc + 1]]
        got = incoming[:mine.size]
        t.sendrecv(buf[b[sc]:b[sc + 1]], right, got, left, tag)
        combine(mine, got, op)


def _ring_all_gather(t: Transport, buf: Any, b: list, tag: int) -> None:
    """Ring all-gather with chunk ``i = [b[i], b[i+1])`` contributed by rank i."""
    n, r = t.size, t.rank
    right, left = (r + 1) % n, (r - 1) % n
    for s in range(n - 1):
        sc, rc = (r - s) % n, (r - s - 1) % n
        t.sendrecv(buf[b[sc]:b[sc + 1]], right, buf[b[rc]:b[rc + 1]], left, tag)


def _hier_device(transport: Transport, buf: Any, op: ReduceOp, tag: int) -> bool:
    """A device buffer: phases (1) and (3) over CUDA IPC on my node, phase (2) staged through
    host memory (unless the MPI is CUDA-aware). False (nothing done) when my node has no
    CUDA-IPC transport: then the caller stages the whole all-reduce."""
    topo = detect_topology(transport)
    plan = _plan(topo, buf.size)
    # Decided alike on every rank (what all of them know: the topology, the stream), so no
    # rank stages the whole all-reduce while another runs the node phases.
    if not (2 <= min(len(n) for n in topo.nodes) and plan.kmax <= MAX_RANKS
            and stream_of(tag) == 0):
        return False
    node = node_transport(transport, topo)  # collective
    if node is None or not cuda_ipc_available(node, buf, tag):
        return False
    inner = ReduceOp.SUM if op is ReduceOp.AVG else op
    cuda_ipc_all_reduce(node, buf, inner, tag)  # (1) every rank of the node: the node's sum
    for j, group in plan.cross:  # (2) my shards across nodes
        shard = buf[plan.shards[j]:plan.shards[j + 1]]
        if shard.size:
            algo = rd_all_reduce if shard.nbytes < RD_MAX_BYTES else ring_all_reduce
            sub = members(transport, group)
            stager = stager_for(sub, shard)

            def across(chunk: Any, algo: Any = algo, sub: Transport = sub) -> None:
                algo(sub, chunk, inner, tag)
            if stager is None:
                across(shard)
            else:
                stager.all_reduce(shard, across)
    cuda_ipc_all_gather(node, buf, plan.region, tag)  # (3)
    finalize(buf, op, transport.size)
    return True


def hier_all_reduce(transport: Transport, buf: Any, op: ReduceOp, tag: int = 0) -> None:
    """All-reduce ``buf`` (1-D, contiguous) in place, node by node; see the module docstring.

    The topology comes from ``detect_topology`` (the process group finds it at construction).
    A device (CuPy) buffer runs phases (1) and (3) with CUDA IPC inside each node and stages
    only phase (2) through host memory; where a node has no CUDA IPC (one rank, TCP, threads)
    the whole all-reduce is staged (``minidist.fastpath.staging``).
    """
    if type(buf) is not np.ndarray and backend.is_device_array(buf) and transport.size > 1 \
            and buf.size > 0:
        if _hier_device(transport, buf, op, tag):
            return
        stager = stager_for(transport, buf)
        if stager is not None:
            stager.all_reduce(buf, lambda chunk: hier_all_reduce(transport, chunk, op, tag))
            return
        # else a CUDA-aware MPI: the message-passing phases below take the device buffer
    n = transport.size
    if n > 1 and buf.size > 0:
        topo = detect_topology(transport)
        inner = ReduceOp.SUM if op is ReduceOp.AVG else op
        plan = _plan(topo, buf.size)
        local = members(transport, plan.local) if len(plan.local) > 1 else None
        shared = None  # the condition is the same on every rank: node_transport is collective
        if plan.kmax > 1 and stream_of(tag) == 0 and type(buf) is np.ndarray:
            shared = node_transport(transport, topo)
        if shared is not None:  # (1) on the shared window: every rank gets the node's sum
            shm_all_reduce(shared, buf, inner, tag)
        elif local is not None:  # (1) reduce-scatter on my node, point to point
            _ring_reduce_scatter(local, buf, plan.region, inner, tag)
        if topo.num_nodes > 1:  # (2) all-reduce my shards across nodes
            for j, group in plan.cross:
                shard = buf[plan.shards[j]:plan.shards[j + 1]]
                if shard.size:
                    algo = rd_all_reduce if shard.nbytes < RD_MAX_BYTES else ring_all_reduce
                    algo(members(transport, group), shard, inner, tag)
        if shared is not None:  # (3) all-gather on my node
            shm_all_gather(shared, buf, plan.region)
        elif local is not None:
            _ring_all_gather(local, buf, plan.region, tag)
    finalize(buf, op, n)


def hier_usable(transport: Transport, buf: Any, stream: int) -> bool:
    """True when the ranks span several nodes (one node: nothing to save)."""
    return detect_topology(transport).num_nodes > 1


# "auto" reaches it by the several-nodes rule (select.choose_for_nodes), not by the model. It
# stages what it must itself (phase (2) only, when the nodes have CUDA IPC).
HIER = Algorithm("hier", hier_all_reduce, usable=hier_usable, candidate=False,
                 takes_device_buffers=True)

__all__ = ["HIER", "hier_all_reduce", "Members", "members", "RD_MAX_BYTES"]
