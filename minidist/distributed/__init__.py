"""``torch.distributed`` by its own path: ``import minidist.distributed as dist``.

    import minidist.distributed as dist               # was: import torch.distributed as dist
    dist.init_process_group(backend="gloo")
    t = minidist.ones(4)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)          # torch's argument order
    dist.destroy_process_group()

The functions here take torch's arguments in torch's order and act on a Tensor or an array in
place, as torch's do; each one calls the minidist function of the same job (``minidist.comm``
for the process group, ``minidist.ddp.collectives`` for Tensors), so there is one
implementation. Where torch's signature differs from minidist's own (``all_reduce``'s third
positional argument is ``group`` here and ``algorithm`` in ``minidist.all_reduce``;
``all_gather`` fills a list of tensors here), this module follows torch. Sub-paths as torch:
``minidist.distributed.algorithms.ddp_comm_hooks.default_hooks`` / ``.powerSGD_hook`` (comm
hooks), ``minidist.distributed.optim`` (ZeroRedundancyOptimizer).
"""

from __future__ import annotations

from typing import Any

from minidist import comm
from minidist.comm import (ProcessGroup, ReduceOp, Work, barrier, destroy_process_group,
                           get_rank, get_world_size, init_process_group, is_initialized,
                           new_group)
from minidist.comm.work import completed
from minidist.ddp import collectives
from minidist.distributed import algorithms, optim
from minidist.distributed.queries import TORCH_NAMES, get_backend


def is_available() -> bool:
    """True: minidist always has a distributed package (torch's ``dist.is_available``)."""
    return True


def is_gloo_available() -> bool:
    """True: ``backend="gloo"`` runs minidist's TCP transport."""
    return True


def is_nccl_available() -> bool:
    """False: there is no NCCL (``backend="nccl"`` runs GPU arrays over MPI or TCP)."""
    return False


def get_default_backend_for_device(device: Any) -> str:
    """torch's answer: ``"gloo"`` for the CPU, ``"nccl"`` for CUDA (minidist runs "nccl" as GPU
    arrays over its MPI or TCP transport; see ``init_process_group``)."""
    kind = device.type if hasattr(device, "type") else str(device).split(":")[0]
    names = {"cpu": "gloo", "cuda": "nccl"}
    if kind not in names:
        raise ValueError(f"get_default_backend_for_device: no default backend for device "
                         f"type {kind!r}; minidist knows 'cpu' (gloo) and 'cuda' (nccl).")
    return names[kind]


def is_mpi_available() -> bool:
    """True when mpi4py imports (the MPI transport can run)."""
    try:
        import mpi4py  # noqa: F401 - only asking whether it is there
    except ImportError:
        return False
    return True


def all_reduce(tensor: Any, op: Any = ReduceOp.SUM, group: Any = None,
               async_op: bool = False) -> Any:
    """torch's ``all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False)``: in place;
    a :class:`Work` with ``async_op=True``, else None as torch."""
    out = collectives.all_reduce(tensor, op, group=group, async_op=async_op)
    return out if async_op else None


def broadcast(tensor: Any, src: int, group: Any = None, async_op: bool = False) -> Any:
    """torch's ``broadcast(tensor, src, group=None, async_op=False)``, in place."""
    out = collectives.broadcast(tensor, src, group, async_op)
    return out if async_op else None


def reduce(tensor: Any, dst: int, op: Any = ReduceOp.SUM, group: Any = None,
           async_op: bool = False) -> Any:
    """torch's ``reduce(tensor, dst, op=ReduceOp.SUM, group=None, async_op=False)``."""
    out = collectives.reduce(tensor, dst, op, group, async_op)
    return out if async_op else None


def all_gather_into_tensor(output_tensor: Any, input_tensor: Any, group: Any = None,
                           async_op: bool = False) -> Any:
    """torch's ``all_gather_into_tensor``: every rank's input, in rank order, into ``output``."""
    out = collectives.all_gather_into(output_tensor, input_tensor, group, async_op)
    return out if async_op else None


def reduce_scatter_tensor(output: Any, input: Any, op: Any = ReduceOp.SUM,  # noqa: A002
                          group: Any = None, async_op: bool = False) -> Any:
    """torch's ``reduce_scatter_tensor``: rank r gets chunk r of the reduced ``input``."""
    out = collectives.reduce_scatter(output, input, op, group, async_op)
    return out if async_op else None


def all_gather(tensor_list: list, tensor: Any, group: Any = None, async_op: bool = False
               ) -> Any:
    """torch's ``all_gather(tensor_list, tensor, group=None, async_op=False)``: entry r of
    ``tensor_list`` (one per rank, each of ``tensor``'s shape) is overwritten with rank r's
    ``tensor``. Runs synchronously; ``async_op=True`` returns a Work that is already done."""
    gathered = collectives.all_gather(tensor, group)
    rows = gathered.array if hasattr(gathered, "requires_grad") else gathered
    if len(tensor_list) != len(rows):
        raise ValueError(f"all_gather: tensor_list has {len(tensor_list)} entries but the group "
                         f"has {len(rows)} ranks. Pass one tensor per rank.")
    for out, row in zip(tensor_list, rows):
        (out.array if hasattr(out, "requires_grad") else out)[...] = row
    if not async_op:
        return None
    return completed("all_gather", f"[rank {get_rank()}/{get_world_size()}]", tensor_list)


def all_gather_object(object_list: list, obj: Any, group: Any = None) -> None:
    """torch's ``all_gather_object(object_list, obj, group=None)``: entry r becomes rank r's
    ``obj`` (JSON-able objects: minidist sends objects as JSON, never pickles)."""
    gathered = comm.all_gather_object(obj, group)
    if len(object_list) != len(gathered):
        raise ValueError(f"all_gather_object: object_list has {len(object_list)} entries but "
                         f"the group has {len(gathered)} ranks. Pass [None] * world_size.")
    object_list[:] = gathered


def broadcast_object_list(object_list: list, src: int = 0, group: Any = None,
                          device: Any = None) -> None:
    """torch's ``broadcast_object_list``: every rank's list becomes rank ``src``'s (JSON-able
    objects)."""
    object_list[:] = comm.broadcast_object(list(object_list), src, group)


__all__ = [
    "ProcessGroup", "ReduceOp", "Work", "TORCH_NAMES", "algorithms", "all_gather",
    "all_gather_into_tensor", "all_gather_object", "all_reduce", "barrier", "broadcast",
    "broadcast_object_list", "destroy_process_group", "get_backend",
    "get_default_backend_for_device", "get_rank",
    "get_world_size", "init_process_group", "is_available", "is_gloo_available",
    "is_initialized", "is_mpi_available", "is_nccl_available", "new_group", "optim", "reduce",
    "reduce_scatter_tensor",
]
