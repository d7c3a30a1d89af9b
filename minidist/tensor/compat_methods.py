"""Tensor's compatibility methods, attached by core.py with the other method tables (not in
the spine): torch's callable ``x.size(dim)``, ``x.is_cuda``, ``len(x)``, ``!=`` and the
ordering operators (bool tensors outside the tape, as ``==``), ``abs(x)``, ``base ** x``,
``array @ x`` and the error for a NumPy array's attribute that a Tensor lacks.
"""

from __future__ import annotations

from typing import Any

import numpy

from minidist import xp as backend
from minidist.tensor import elementwise, linalg, mathops, torch_methods
from minidist.tensor.core import Tensor, error


class ElementCount(int):
    """``Tensor.size``: an int (the element count) that torch code can call: ``x.size(1)``."""

    shape: tuple[int, ...]

    def __new__(cls, numel: int, shape: tuple[int, ...]) -> ElementCount:
        obj = super().__new__(cls, numel)
        obj.shape = shape
        return obj

    def __call__(self, dim: int | None = None) -> Any:
        return self.shape if dim is None else self.shape[dim]


def size(self: Tensor) -> ElementCount:
    """Number of elements (NumPy's ``x.size``), also callable as torch's ``x.size(dim)``.

    ``x.size`` is an int (the element count); ``x.size()`` is the shape tuple and
    ``x.size(1)`` the length of dim 1, as in torch.
    """
    return ElementCount(int(self.array.size), tuple(self.array.shape))


def is_cuda(self: Tensor) -> bool:
    """True when the data lives on a GPU (a CuPy array)."""
    return backend.is_device_array(self.array)


def getattr_hint(self: Tensor, name: str) -> Any:
    """``Tensor.__getattr__``, only for names Tensor lacks: say so clearly when it is an array's
    (``p.grad.copy()`` from code written when ``.data``/``.grad`` were arrays), with torch's
    spelling where NumPy's method means something else (``torch_methods.UNLIKE_NUMPY``)."""
    if not name.startswith("__") and hasattr(numpy.ndarray, name):
        raise AttributeError(error(f"Tensor.{name}", torch_methods.unlike_numpy_message(
            name) or f"'Tensor' object has no attribute {name!r} (a NumPy array's, with no "
            "torch method of that name). .data and .grad are Tensors, as in torch: for the "
            "array use .array (NumPy or CuPy, no copy) or .numpy() (on the host)."))
    raise AttributeError(f"'Tensor' object has no attribute {name!r}")


def length(self: Tensor) -> int:
    """``len(x)``: the size of dim 0."""
    if self.array.ndim == 0:
        raise TypeError(error("len", "len() of a 0-d tensor. Use .item()."))
    return int(self.array.shape[0])


def rmatmul(self: Tensor, other: Any) -> Tensor:
    """``other @ self`` for an array ``other``."""
    return linalg.matmul(Tensor(other), self)


def _ordering(op: str) -> Any:
    def compare(self: Tensor, other: Any) -> Tensor:
        return elementwise.compare(op, self, other)

    compare.__name__ = f"__{op}__"
    return compare


METHODS: dict[str, Any] = {
    "size": property(size), "is_cuda": property(is_cuda), "__getattr__": getattr_hint,
    "__ne__": _ordering("ne"), "__lt__": _ordering("lt"), "__le__": _ordering("le"),
    "__gt__": _ordering("gt"), "__ge__": _ordering("ge"), "__len__": length,
    "__abs__": mathops.abs, "__rpow__": elementwise.rpow, "__rmatmul__": rmatmul,
}
