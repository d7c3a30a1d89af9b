"""Checks and defaults of DistributedDataParallel's constructor options.

    check_device_ids(module, device_ids, output_device)   # torch's one-device-per-process rule
    auto_overlap(world_size)                               # what overlap="auto" picks
"""

from __future__ import annotations

import os
from typing import Any

from minidist import xp as backend
from minidist.logger import rank_prefix


def check_device_ids(module: Any, device_ids: Any, output_device: Any) -> None:
    """Raise ValueError unless ``device_ids``/``output_device`` name where the parameters are.

    torch's rule for one device per process: ``device_ids`` is None or ``[that device]``; for
    CPU modules it must be None.
    """
    devices = {backend.device_of(p.data) for p in module.parameters()}
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


_LOCAL_SIZE_VARS = ("LOCAL_WORLD_SIZE", "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE")


def auto_overlap(world_size: int, cpus: int | None = None, env: Any = None) -> bool:
    """What ``overlap="auto"`` picks, from where the communication time goes (measured on a
    2-vCPU VM, docs/how_ddp_works.md)::

        ranks on this node x 2 <= cores  ->  True:  the comm thread gets a core of its own, so
                                             the all-reduce runs beside backward
        ranks on this node > cores       ->  True:  oversubscribed; most of the "comm" time is
                                             waiting for descheduled peers, and a comm thread
                                             lets backward go on meanwhile (n=4 on 2 vCPUs:
                                             1-10% faster in every run)
        otherwise (about a core a rank)  ->  False: the shared-memory all-reduce is CPU work
                                             (adds, copies) that can only time-slice with
                                             backward on the same core; the thread adds
                                             hand-offs and GIL switches (n=2 on 2 vCPUs: on
                                             vs off within noise, off ahead in most runs)

    Ranks on this node: ``LOCAL_WORLD_SIZE`` (torchrun), ``MPI_LOCALNRANKS`` (MPICH),
    ``OMPI_COMM_WORLD_LOCAL_SIZE`` (Open MPI), else ``world_size`` (one node assumed).
    """
    if world_size <= 1:
        return False
    env = os.environ if env is None else env
    local = next((int(env[v]) for v in _LOCAL_SIZE_VARS if str(env.get(v, "")).isdigit()),
                 world_size)
    local = max(local, 1)
    cpus = cpus if cpus is not None else (os.cpu_count() or 1)
    return 2 * local <= cpus or local > cpus


__all__ = ["auto_overlap", "check_device_ids"]
