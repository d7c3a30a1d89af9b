"""torch.distributed-style collectives that take a minidist Tensor as well as an array.

    import minidist as dist                        # these are the top-level names
    t = minidist.ones(4)
    dist.all_reduce(t)                             # in place on t's array, like torch
    work = dist.broadcast(t, src=0, async_op=True); work.wait()

``minidist.comm`` moves plain xp arrays and never imports the tensor layer; this module, one
layer up, unwraps a Tensor to its array (``t.array``, no copy) and calls the comm function.
The result is what torch gives: the Tensor itself (minidist.comm returns the array), or a
:class:`minidist.comm.Work` with ``async_op=True``.
"""

from __future__ import annotations

from typing import Any

from minidist import comm
from minidist.tensor import Tensor


def _array(x: Any) -> Any:
    return x.array if isinstance(x, Tensor) else x


def _same(x: Any, result: Any) -> Any:
    """The Tensor the caller passed (its array was written in place), else comm's result."""
    return x if isinstance(x, Tensor) and not isinstance(result, comm.Work) else result


def all_reduce(tensor: Any, op: Any = "sum", algorithm: str | None = None, group: Any = None,
               label: str | None = None, async_op: bool = False) -> Any:
    """``comm.all_reduce`` on a Tensor or array (in place), with comm's argument order:
    ``algorithm`` comes third, so pass torch's ``group`` and ``async_op`` by keyword.

    A blocking call goes straight to the group's ``all_reduce``, as ``comm.all_reduce`` does
    (one Python frame less on the path of every small all-reduce)."""
    if async_op:
        return comm.all_reduce(_array(tensor), op, algorithm, group, label, async_op=True)
    g = group if group is not None else comm.get_default_group()
    if type(tensor) is Tensor:
        g.all_reduce(tensor.array, op, algorithm, 0, label, 2)  # (2: the ledger names my
        return tensor                                           # caller's line)
    return g.all_reduce(tensor, op, algorithm, 0, label, 2)


def broadcast(tensor: Any, src: int = 0, group: Any = None, async_op: bool = False) -> Any:
    """``comm.broadcast`` on a Tensor or array (in place)."""
    return _same(tensor, comm.broadcast(_array(tensor), src, group, async_op=async_op))


def all_gather_into(output: Any, tensor: Any, group: Any = None, async_op: bool = False) -> Any:
    """``comm.all_gather_into`` (torch's ``all_gather_into_tensor``) on Tensors or arrays."""
    return _same(output, comm.all_gather_into(_array(output), _array(tensor), group,
                                              async_op=async_op))


def reduce_scatter(output: Any, input: Any, op: Any = "sum", group: Any = None,
                   async_op: bool = False) -> Any:
    """``comm.reduce_scatter`` (torch's ``reduce_scatter_tensor``) on Tensors or arrays."""
    return _same(output, comm.reduce_scatter(_array(output), _array(input), op, group,
                                             async_op=async_op))


def reduce(tensor: Any, dst: int = 0, op: Any = "sum", group: Any = None,
           async_op: bool = False) -> Any:
    """``comm.reduce`` on a Tensor or array (in place on ``dst``)."""
    return _same(tensor, comm.reduce(_array(tensor), dst, op, group, async_op=async_op))


def all_gather(tensor: Any, group: Any = None) -> Any:
    """``comm.all_gather``: a new ``(world_size, *shape)`` array (a Tensor for a Tensor)."""
    out = comm.all_gather(_array(tensor), group)
    return Tensor(out) if isinstance(tensor, Tensor) else out


__all__ = ["all_reduce", "broadcast", "all_gather_into", "reduce_scatter", "reduce",
           "all_gather"]
