"""Multi-tensor tables: many same-dtype tensors as ONE array and a table of offsets into it.

    table = multi_tensor.table_of([(p0, g0, m0, v0), (p1, g1, m1, v1), ...])
    kernels.multi_step(entry, table.base, table.offsets, table.max_numel, scalars)  # one call

A fused optimizer step over unflattened parameters would be one kernel call per tensor (each
tensor, its gradient and its state are separate allocations). torch's multi-tensor apply
passes many tensors to one launch; this does the same with two arrays: ``base``, a 1-D array
that starts at the lowest address among all the tensors and ends at the highest, and
``offsets``, where row k holds tensor k's columns as element offsets from ``base``, then its
numel. ``base`` is only an address range: the kernels touch exactly the elements the table
names, all inside live tensors (the optimizer holds them during the call)::

    memory   |--p0--| .. |--g0--| ... |--p1--|  .. |--m0--| ...      (separate allocations)
    base     [^ lowest address                            highest end ^]
    offsets  row 0: [off(p0), off(g0), off(m0), off(v0), numel0]
             row 1: [off(p1), off(g1), off(m1), off(v1), numel1]

    kernel:  for k in rows:  for j in range(numel_k):  update base[off(p_k) + j], ...

The table is built once per set of addresses (the plan) and cached: the parameters, their
state and, after the first steps, their gradients (the allocator hands the same blocks back
every step) keep their addresses, so a step costs one lookup and one launch. On a GPU the
table lives on the device (uploaded once per plan) and ``base`` is a CuPy array over the
address range; on the CPU a NumPy one. Tensors whose addresses are not a whole number of
elements apart (not possible for arrays of one dtype that NumPy or CuPy allocated; possible
for a view made with a byte offset) give no table: the caller takes the per-run path.
"""

from __future__ import annotations

import collections
import weakref
from typing import Any, Hashable, NamedTuple

import numpy as np

from minidist import xp as backend

__all__ = ["MultiTensorTable", "table_of", "PLAN_CACHE_SIZE", "clear"]

PLAN_CACHE_SIZE = 64
_PLANS: collections.OrderedDict[Hashable, MultiTensorTable] = collections.OrderedDict()


class MultiTensorTable(NamedTuple):
    """``base`` (1-D, spanning every tensor) and ``offsets`` (int64, one row per tensor:
    the columns' element offsets in ``base``, then the numel), on the tensors' device."""

    base: Any
    offsets: Any
    max_numel: int


class _Span:
    """A NumPy view of an address range (``__array_interface__`` with a raw pointer)."""

    def __init__(self, address: int, numel: int, dtype: np.dtype) -> None:
        self.__array_interface__ = {"data": (address, False), "shape": (numel,),
                                    "typestr": dtype.str, "version": 3}


_ADDRESSES: dict[int, tuple[Any, int]] = {}


def _address(a: Any) -> int:
    """``a``'s data address; remembered per array object (an array's data never moves), since
    reading it is a Python-level call and a step reads four per tensor: parameters and state
    are the same objects every step, so only new gradients are read."""
    entry = _ADDRESSES.get(id(a))
    if entry is not None and entry[0]() is a:
        return entry[1]
    address = int(a.data.ptr) if backend.is_device_array(a) else \
        int(a.__array_interface__["data"][0])
    try:
        ref = weakref.ref(a)
    except TypeError:  # not weak-referenceable: read every time
        return address
    if len(_ADDRESSES) > 8192:
        _ADDRESSES.clear()
    _ADDRESSES[id(a)] = (ref, address)
    return address


def _span_array(like: Any, address: int, numel: int) -> Any:
    if backend.is_device_array(like):
        cupy = backend.get_array_module(like)
        memory = cupy.cuda.UnownedMemory(address, numel * like.itemsize, owner=None,
                                         device_id=like.device.id)
        return cupy.ndarray((numel,), like.dtype, memptr=cupy.cuda.MemoryPointer(memory, 0))
    return np.asarray(_Span(address, numel, like.dtype))


def table_of(items: list[tuple[Any, ...]]) -> MultiTensorTable | None:
    """The table for ``items`` (each a tuple of same-shape, C-contiguous arrays of one dtype
    and device: a tensor's columns, e.g. (param, grad, exp_avg, exp_avg_sq)), or None when
    the addresses do not allow one (see the module docstring). Cached per set of addresses."""
    first = items[0][0]
    itemsize = first.itemsize
    addresses = tuple(_address(a) for item in items for a in item)
    numels = tuple(int(item[0].size) for item in items)
    key = (addresses, numels, first.dtype.char, backend.is_device_array(first))
    table = _PLANS.get(key)
    if table is not None:
        _PLANS.move_to_end(key)
        return table
    low = min(addresses)
    columns = len(items[0])
    ends = [addr + numels[k // columns] * itemsize for k, addr in enumerate(addresses)]
    if any((addr - low) % itemsize for addr in addresses):
        return None
    rows = np.empty((len(items), columns + 1), dtype=np.int64)
    rows[:, :columns] = (np.array(addresses, dtype=np.int64).reshape(len(items), columns)
                         - low) // itemsize
    rows[:, columns] = numels
    base = _span_array(first, low, (max(ends) - low) // itemsize)
    offsets = backend.get_array_module(first).asarray(rows)  # a device upload, once per plan
    table = MultiTensorTable(base, offsets, max(numels))
    _PLANS[key] = table
    if len(_PLANS) > PLAN_CACHE_SIZE:
        _PLANS.popitem(last=False)
    return table


def clear() -> None:
    """Forget every cached table and address (tests)."""
    _PLANS.clear()
    _ADDRESSES.clear()
