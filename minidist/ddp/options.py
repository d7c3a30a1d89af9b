"""Checks and defaults of DistributedDataParallel's constructor options.

    check_device_ids(module, device_ids, output_device)   # torch's one-device-per-process rule
    auto_overlap(world_size)                               # what overlap="auto" picks
    resolve_overlap(overlap, module, world_size)           # True, False or "auto" -> a bool
    first_bucket_cap(first_mb, cap_mb, overlap, group)     # the first bucket's cap (agreed)
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from minidist import xp as backend
from minidist.comm.env import cores_per_rank, ranks_on_this_node
from minidist.ddp.sync_batchnorm import SyncBatchNorm
from minidist.logger import rank_prefix


def check_device_ids(module: Any, device_ids: Any, output_device: Any) -> None:
    """Raise ValueError unless ``device_ids``/``output_device`` name where the parameters are.

    torch's rule for one device per process: ``device_ids`` is None or ``[that device]``; for
    CPU modules it must be None.
    """
    devices = {backend.device_of(p.array) for p in module.parameters()}
    where = ", ".join(sorted(str(d) for d in devices)) or "nowhere (no parameters)"
    if device_ids is None:
        if output_device is not None:
            raise ValueError(f"{rank_prefix()} DistributedDataParallel: output_device="
                             f"{output_device!r} was given without device_ids. Pass both "
                             "(device_ids=[local_rank], output_device=local_rank) or neither.")
        return
    if isinstance(device_ids, (str, int, backend.device)) or len(device_ids) != 1:
        raise ValueError(f"{rank_prefix()} DistributedDataParallel: device_ids={device_ids!r}; "
                         "minidist runs one device per process, so pass a one-element list "
                         "such as [local_rank], or None.")
    wanted = backend.device(device_ids[0])
    same = devices == {wanted} or (wanted.index is None and {d.type for d in devices} == {
        wanted.type})  # "cuda" without a number: any one GPU
    if wanted.type == "cpu" or not same:
        raise ValueError(f"{rank_prefix()} DistributedDataParallel: device_ids={device_ids!r} "
                         f"but the module's parameters are on {where}. Move the model first "
                         f"(model.to({str(wanted)!r})), or pass device_ids=None for a CPU "
                         "module.")
    if output_device is not None and backend.device(output_device) != wanted:
        raise ValueError(f"{rank_prefix()} DistributedDataParallel: output_device="
                         f"{output_device!r} differs from device_ids[0]={device_ids[0]!r}. Use "
                         "the same device (or leave output_device=None).")


def auto_overlap(world_size: int, cpus: int | None = None, env: Any = None) -> bool:
    """What ``overlap="auto"`` picks, from the cores each rank of this node can count on
    (``comm.env.cores_per_rank``: this process's CPU affinity and the ranks on this node)::

        2 or more cores per rank  ->  True:  the comm thread gets a core of its own, so the
                                      all-reduce runs beside backward
        fewer cores than ranks    ->  True:  oversubscribed; much of the "comm" time is waiting
                                      for descheduled peers, and a comm thread lets backward
                                      go on meanwhile
        otherwise (about a core   ->  False: the all-reduce is CPU work (adds, copies) that can
        a rank)                              only time-slice with backward on the same core;
                                             the thread adds hand-offs and GIL switches

    The measurements behind each rule: docs/perf_notes.md ("overlap=auto"). ``cpus``: the
    cores to assume for this process (default: its affinity); ``env``: the launcher's
    variables (default ``os.environ``; ``comm.env.ranks_on_this_node`` reads them).
    """
    if world_size <= 1:
        return False
    local = ranks_on_this_node(world_size, os.environ if env is None else env)
    per_rank = (cores_per_rank(local) if cpus is None
                else cores_per_rank(local, cores=cpus, machine_cores=cpus))
    return per_rank >= 2 or per_rank < 1


def resolve_overlap(overlap: bool | str, module: Any, world_size: int) -> bool:
    """What DistributedDataParallel's ``overlap`` (True, False or "auto") means for ``module``.

    SyncBatchNorm all-reduces inside backward on the main thread; a comm thread reducing
    buckets at the same time could order the two differently on different ranks. So True is
    refused for a model with SyncBatchNorm layers, and "auto" is off for it (otherwise
    ``auto_overlap``).
    """
    sync_bn = any(isinstance(m, SyncBatchNorm) for m in getattr(module, "modules", list)())
    if overlap is True and sync_bn and world_size > 1:
        raise ValueError(f"{rank_prefix()} DistributedDataParallel: overlap=True with "
                         "SyncBatchNorm layers in the model: their backward all-reduce would "
                         "race the comm thread's bucket reductions. Pass overlap=False or "
                         "'auto'.")
    if overlap == "auto":
        return auto_overlap(world_size) and not sync_bn
    if not isinstance(overlap, bool):
        raise ValueError(f"{rank_prefix()} DistributedDataParallel: overlap={overlap!r}; "
                         "use True, False or 'auto'.")
    return overlap


def first_bucket_cap(first_mb: float, cap_mb: float, overlap: bool, group: Any) -> float:
    """The first bucket's size limit in MiB: its own (``first_bucket_cap_mb``) where buckets are
    reduced while backward runs, so that the first all-reduce starts early; the others'
    (``bucket_cap_mb``) where no rank overlaps. Without overlap every bucket is reduced at the
    end of backward, one after another, and a small first bucket would only add a collective
    (on the shared-memory path: two barriers and the Python of a call) to every step.

    Collective: the bucket plan must be the same on every rank, and "auto" decides overlap from
    each node's cores, so the ranks agree first (one all-reduce MAX of a flag: one rank that
    overlaps keeps the small first bucket for all).
    """
    if group.size > 1:
        flag = np.array([int(overlap)], np.int64)
        group.all_reduce(flag, "max", "auto")  # (a host flag, whatever the group's default)
        overlap = bool(flag[0])
    return first_mb if overlap else max(first_mb, cap_mb)


__all__ = ["auto_overlap", "check_device_ids", "first_bucket_cap", "resolve_overlap"]
