"""Collectives written from scratch over point-to-point messages.

    import minidist as md                 # the same names are re-exported at the top level
    md.init_process_group()
    md.all_reduce(buf, op="sum", algorithm="ring")

Layers inside (each imports only the ones above it in this list):
``env`` (launcher detection) -> ``ops`` (ReduceOp), ``errors``, ``advice`` -> ``transports``
(local, threads, mpi) -> ``topology`` (nodes, local ranks) -> ``algorithms`` (the registry:
direct, ring, tree, rd) -> ``calls`` (call numbers, message tags, the observer interface) ->
``planner`` -> ``validate``, ``collectives``, ``group`` (ProcessGroup) -> ``backends`` ->
``api``. Beside those, off the reading path: ``transports.side`` (the side channel),
``transports.nodes`` (byte counters), ``transports.mpi_handles``, ``transports.thread_runner``,
``algorithms.rabenseifner``, ``objects`` (``*_object``), ``subgroups`` (``new_group``),
``group_auto_choice`` (what "auto" picks), ``group_shared_memory`` (shared buffers),
``init_options`` (torch's init options) and ``api_beyond_tensors`` (sub-groups, objects, the
ledger at module level). The wings attach here through seams: the watch wing (ledger, failure
handling), the fast paths, TCP and ``auto`` (minidist/wings.py).
See docs/algorithms.md, docs/env_vars.md and docs/troubleshooting.md.
"""

from __future__ import annotations

from minidist.comm.api import (
    all_gather,
    all_gather_into,
    all_gather_object,
    all_reduce,
    auto_table,
    barrier,
    broadcast,
    broadcast_object,
    destroy_process_group,
    get_default_group,
    get_ledger,
    get_local_rank,
    get_rank,
    get_world_size,
    init_process_group,
    is_initialized,
    is_main_process,
    new_group,
    reduce,
    reduce_scatter,
    require_group_if_launched,
)
from minidist.comm.env import LaunchInfo, detect_launch
from minidist.comm.errors import (CollectiveMismatch, CollectiveMismatchTimeout, CommError,
                                  CommTimeout, PeerFailed)
from minidist.comm.group import ProcessGroup, new_group_from_transport
from minidist.comm.ops import ReduceOp
from minidist.comm.topology import Topology
from minidist.comm.work import Work

__all__ = [
    "all_gather", "all_gather_into", "all_gather_object", "all_reduce", "barrier", "broadcast",
    "broadcast_object", "destroy_process_group", "get_default_group", "get_local_rank",
    "get_rank", "get_world_size", "init_process_group", "is_initialized", "is_main_process",
    "new_group", "reduce", "reduce_scatter", "require_group_if_launched", "Work", "LaunchInfo", "detect_launch", "CommError", "CommTimeout",
    "CollectiveMismatch", "CollectiveMismatchTimeout", "PeerFailed", "ProcessGroup",
    "new_group_from_transport", "ReduceOp", "auto_table", "get_ledger", "Topology",
]
