"""torch's functions and Tensor methods whose NumPy namesakes mean something else, with torch's
meaning (indexing.py, statistics.py, einsum.py hold the ops; this module gives them torch's
signatures, as ``minidist.<name>`` and ``Tensor.<name>``).

    x.repeat(4, 1)                 # torch: tile; NumPy's ndarray.repeat repeats elements
    x.std(), x.var(dim=1)          # torch: n - 1 (Bessel); NumPy's ndarray.std divides by n
    x.sort(dim=1)                  # torch: (values, indices); NumPy's sorts in place
    minidist.max(x, 1)             # torch: (values, indices); x.max(other) is maximum
    minidist.sum(x, dim=1), minidist.einsum("ij,jk->ik", a, b)

``UNLIKE_NUMPY`` lists NumPy attributes that a Tensor lacks and that torch spells or means
differently; ``Tensor.__getattr__`` (core.py) answers those with torch's spelling instead of
pointing at ``.array``.
"""

from __future__ import annotations

from typing import Any

import numpy

from minidist import xp as backend
from minidist.tensor import elementwise, indexing, reduce, shape as shape_ops, statistics
from minidist.tensor.core import Tensor, error
from minidist.tensor.einsum import einsum

# ---- torch's functions (minidist.<name>) ----------------------------------------------------


def _is_tensor_like(v: Any) -> bool:
    return isinstance(v, (Tensor, numpy.ndarray)) or backend.is_device_array(v)


def sum(input: Tensor, dim: Any = None, keepdim: bool = False, *,  # noqa: A001,A002
        dtype: Any = None) -> Tensor:
    """torch's ``sum(input, dim=None, keepdim=False, *, dtype=None)``."""
    x = input if dtype is None else elementwise.astype(input, dtype)
    return reduce.sum(x, dim, keepdim)


def mean(input: Tensor, dim: Any = None, keepdim: bool = False, *,  # noqa: A002
         dtype: Any = None) -> Tensor:
    x = input if dtype is None else elementwise.astype(input, dtype)
    return reduce.mean(x, dim, keepdim)


def max(input: Tensor, dim: Any = None, keepdim: bool = False) -> Any:  # noqa: A001,A002
    """torch's ``max``: of all elements; ``(values, indices)`` along ``dim``; or, given a
    tensor, the elementwise maximum (``torch.max(a, b)``)."""
    if _is_tensor_like(dim):
        return indexing.maximum(input, dim)
    if dim is None:
        return reduce.max(input)
    return reduce.max_dim(input, dim, keepdim)


def min(input: Tensor, dim: Any = None, keepdim: bool = False) -> Any:  # noqa: A001,A002
    """torch's ``min``: as ``max``."""
    if _is_tensor_like(dim):
        return indexing.minimum(input, dim)
    if dim is None:
        return reduce.min(input)
    return reduce.min_dim(input, dim, keepdim)


def argmax(input: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:  # noqa: A002
    return reduce.argmax(input, dim, keepdim)


def argmin(input: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:  # noqa: A002
    return reduce.argmin(input, dim, keepdim)


# ---- Tensor methods with torch's meaning --------------------------------------------------------


def _sizes(sizes: tuple) -> tuple:
    return tuple(sizes[0]) if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)) else sizes


def repeat(self: Tensor, *sizes: Any) -> Tensor:
    return indexing.repeat(self, *_sizes(sizes))


def ravel(self: Tensor) -> Tensor:
    return shape_ops.reshape(self, -1)


def matrix_transpose(self: Tensor) -> Tensor:
    """``x.mT``: the last two dims swapped."""
    return shape_ops.swapaxes(self, -2, -1)


def dot(self: Tensor, other: Any) -> Tensor:
    """torch's ``dot``: 1-D tensors only (NumPy's ``dot`` also multiplies matrices)."""
    other = other if isinstance(other, Tensor) else Tensor(other)
    if self.ndim != 1 or other.ndim != 1:
        raise RuntimeError(error("dot", f"1D tensors expected, but got {self.ndim}D and "
                                 f"{other.ndim}D tensors (torch's dot). Use @ or matmul."))
    return reduce.sum(self * other)


def round_(self: Tensor, decimals: int = 0) -> Tensor:
    """torch's ``round`` (half to even, as NumPy); its gradient is zero, as torch's."""
    xp = backend.get_array_module(self.array)
    out = xp.round(self.array, decimals)
    return Tensor._make(out, (self,), lambda g: (xp.zeros_like(g),), "round")


def pin_memory(self: Tensor, device: Any = None) -> Tensor:
    """torch's ``pin_memory()``: with a GPU, the same tensor (page-locked host memory is not
    modelled; copies to the GPU are synchronous anyway); without one it raises, as torch."""
    if not backend.gpu_available():
        raise backend.DeviceUnavailableError(error(
            "Tensor.pin_memory", "pinned memory needs a GPU (torch raises here too: 'Cannot "
            "access accelerator device when none is available'). Call it only when "
            "minidist.cuda.is_available()."))
    return self


def element_size(self: Tensor) -> int:
    return int(self.array.itemsize)


METHODS: dict[str, Any] = {
    "repeat": repeat, "repeat_interleave": indexing.repeat_interleave,
    "sort": indexing.sort, "argsort": indexing.argsort, "gather": indexing.gather,
    "take": indexing.take, "index_select": indexing.index_select,
    "nonzero": indexing.nonzero, "maximum": indexing.maximum, "minimum": indexing.minimum,
    "kthvalue": indexing.kthvalue, "median": indexing.median, "unique": indexing.unique,
    "std": statistics.std, "var": statistics.var, "cumsum": statistics.cumsum,
    "cumprod": statistics.cumprod, "prod": statistics.prod,
    "swapaxes": shape_ops.swapaxes, "ravel": ravel, "mT": property(matrix_transpose),
    "dot": dot, "round": round_, "pin_memory": pin_memory,
    "is_pinned": lambda self: False, "is_xpu": property(lambda self: False),
    "element_size": element_size, "itemsize": property(element_size),
    "nbytes": property(lambda self: int(self.array.nbytes)),
}

# NumPy attributes a Tensor lacks, which torch spells or means differently: what to write
UNLIKE_NUMPY: dict[str, str] = {
    "copy": "torch's Tensor has no copy(): use x.clone() (x.detach().clone() off the tape), "
            "or x.array.copy() for a copy of the array",
    "fill": "torch spells it x.fill_(value)",
    "resize": "NumPy's resize repeats the data to fill the new shape, torch's resize_ leaves "
              "it unset; use x.reshape(shape) or x.view(shape) to keep the elements",
    "put": "torch's put/put_(index, source, accumulate=False) takes a Tensor of values; "
           "write x.view(-1)[index] = source under no_grad",
    "strides": "torch's x.stride() counts elements, NumPy's strides bytes; minidist's Tensor "
               "has neither: x.array.strides are NumPy's (bytes)",
    "searchsorted": "torch's searchsorted(sorted_sequence, values) takes the sequence first; "
                    "minidist has none: numpy.searchsorted(seq.numpy(), values.numpy())",
}


def unlike_numpy_message(name: str) -> str | None:
    """The torch spelling for a NumPy attribute in ``UNLIKE_NUMPY``, else None."""
    hint = UNLIKE_NUMPY.get(name)
    return None if hint is None else (
        f"'Tensor' object has no attribute {name!r}. NumPy's ndarray.{name} differs from "
        f"torch: {hint}. (.data and .grad are Tensors, as in torch; the array is .array.)")


__all__ = ["sum", "mean", "max", "min", "argmax", "argmin", "einsum", "METHODS",
           "UNLIKE_NUMPY", "unlike_numpy_message", "repeat"]
