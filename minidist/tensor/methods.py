"""torch's method spellings of the ops: ``x.relu()``, ``x.sum(dim=1)``, ``x.view(-1, 4)``.

    >>> from minidist.tensor import Tensor
    >>> x = Tensor([[1.0, -2.0], [3.0, -4.0]])
    >>> x.relu().sum(dim=1).tolist()
    [1.0, 3.0]

Where an op's own signature is already torch's method's (``elementwise.exp(a)``,
``mathops.clamp(input, min, max)``), ``METHODS`` names the op itself. Every function here is a
method that needs more: a torch argument name or default (``mul(other)``, ``sum(dim=...)``),
written as a plain function whose first parameter is the tensor (``self``) and whose body
hands the work to the op module that owns it (with the backward beside the forward):
``elementwise``, ``reduce``, ``shape``, ``mathops``, ``views``, ``functional``, ``creation``
(``new_zeros`` and friends: a creation function with this tensor's dtype and device as
defaults). Nothing here touches the tape or private fields; the functions use only what a
Tensor offers anyone (``.array``, ``.shape``, the operators).
``METHODS`` at the bottom names each one, and ``core.py`` attaches that table to the class in
one visible place, so ``Tensor.relu is elementwise.relu`` and ``Tensor.sum is methods.sum``.

The in-place spellings (``add_``, ``zero_``, ``t += x``) are in ``inplace_methods``; the
conversions (``.float()``, ``.to()``, ``.numpy()``, printing) in ``conversion``.
"""

from __future__ import annotations

from typing import Any

from minidist import xp as backend
from minidist.tensor import creation, elementwise, functional, indexing, mathops, reduce, views
from minidist.tensor import shape as shape_ops
from minidist.tensor.core import Tensor, error


def _axis(axis: Any, dim: Any) -> Any:
    """NumPy's ``axis`` or torch's ``dim`` (at most one of them)."""
    if axis is not None and dim is not None:
        raise TypeError(error("reduce", f"got both axis={axis!r} and dim={dim!r}; pass one."))
    return dim if dim is not None else axis


# ---- elementwise math (elementwise.py, mathops.py) ---------------------------------------------

def add(self: Tensor, other: Any, *, alpha: Any = 1) -> Tensor:
    return elementwise.add(self, other if alpha == 1 else other * alpha)


def sub(self: Tensor, other: Any, *, alpha: Any = 1) -> Tensor:
    return elementwise.sub(self, other if alpha == 1 else other * alpha)


def mul(self: Tensor, other: Any) -> Tensor:
    return elementwise.mul(self, other)


def div(self: Tensor, other: Any) -> Tensor:
    return elementwise.div(self, other)


def addcmul(self: Tensor, tensor1: Any, tensor2: Any, *, value: Any = 1) -> Tensor:
    return self + tensor1 * tensor2 * value


def addcdiv(self: Tensor, tensor1: Any, tensor2: Any, *, value: Any = 1) -> Tensor:
    return self + tensor1 / tensor2 * value


def norm(self: Tensor, p: Any = "fro", dim: Any = None, keepdim: bool = False,
         dtype: Any = None) -> Tensor:
    return mathops.norm(self, p, dim, keepdim, dtype)


def where(self: Tensor, condition: Any, other: Any) -> Tensor:
    """torch's method form: ``self`` where ``condition``, ``other`` elsewhere."""
    return mathops.where(condition, self, other)


def trace(self: Tensor) -> Tensor:
    return mathops.trace(self)


def clone(self: Tensor) -> Tensor:
    """A copy of the data that stays on the tape (torch's ``clone``)."""
    return elementwise.clone(self)


def masked_fill(self: Tensor, mask: Any, value: Any) -> Tensor:
    """``value`` where the bool ``mask`` is True (broadcast), this tensor elsewhere."""
    return elementwise.masked_fill(self, mask, value)


# ---- comparisons by name: bool tensors, outside the tape (``pred.eq(y).sum().item()``) --------

def eq(self: Tensor, other: Any) -> Tensor:
    return elementwise.compare("eq", self, other)


def ne(self: Tensor, other: Any) -> Tensor:
    return elementwise.compare("ne", self, other)


def all(self: Tensor, dim: Any = None, keepdim: bool = False, *,  # noqa: A001 - torch's name
        axis: Any = None, out: Any = None) -> Tensor:
    """Whether every element (along ``dim``) is non-zero: bool, outside the tape."""
    xp = backend.get_array_module(self.array)
    return Tensor(xp.asarray(self.array.all(axis=_axis(axis, dim), keepdims=keepdim)))


def any(self: Tensor, dim: Any = None, keepdim: bool = False, *,  # noqa: A001 - torch's name
        axis: Any = None, out: Any = None) -> Tensor:
    """Whether some element (along ``dim``) is non-zero: bool, outside the tape."""
    xp = backend.get_array_module(self.array)
    return Tensor(xp.asarray(self.array.any(axis=_axis(axis, dim), keepdims=keepdim)))


# ---- reductions (reduce.py): NumPy's ``axis=``/``keepdims=`` and torch's ``dim=``/``keepdim=``;
# the first positional argument means the same in both -------------------------------------------

def sum(self: Tensor, axis: Any = None, keepdims: bool = False, *,  # noqa: A001 - torch's name
        dim: Any = None, keepdim: bool = False) -> Tensor:
    return reduce.sum(self, _axis(axis, dim), keepdims or keepdim)


def mean(self: Tensor, axis: Any = None, keepdims: bool = False, *, dim: Any = None,
         keepdim: bool = False) -> Tensor:
    return reduce.mean(self, _axis(axis, dim), keepdims or keepdim)


def max(self: Tensor, dim: int | None = None, keepdim: bool = False, *,  # noqa: A001
        axis: int | None = None, keepdims: bool = False) -> Any:
    """torch's spelling ``x.max(dim)`` returns ``(values, indices)``, ``x.max(other)`` the
    elementwise maximum; NumPy's ``x.max(axis=1)`` and ``x.max()`` the values (a Tensor)."""
    if isinstance(dim, Tensor):
        return indexing.maximum(self, dim)
    if dim is not None:
        return reduce.max_dim(self, dim, keepdim or keepdims)
    return reduce.max(self, axis, keepdims or keepdim)


def min(self: Tensor, dim: int | None = None, keepdim: bool = False, *,  # noqa: A001
        axis: int | None = None, keepdims: bool = False) -> Any:
    """Like ``max``: ``x.min(dim)`` gives ``(values, indices)``, ``x.min(other)`` the
    elementwise minimum, ``x.min(axis=1)`` values."""
    if isinstance(dim, Tensor):
        return indexing.minimum(self, dim)
    if dim is not None:
        return reduce.min_dim(self, dim, keepdim or keepdims)
    return reduce.min(self, axis, keepdims or keepdim)


def argmax(self: Tensor, dim: int | None = None, keepdim: bool = False, *,
           axis: int | None = None) -> Tensor:
    """Indices of the maxima (an int64 tensor, outside the tape)."""
    return reduce.argmax(self, _axis(axis, dim), keepdim)


def argmin(self: Tensor, dim: int | None = None, keepdim: bool = False, *,
           axis: int | None = None) -> Tensor:
    """Indices of the minima (an int64 tensor, outside the tape)."""
    return reduce.argmin(self, _axis(axis, dim), keepdim)


def topk(self: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> Any:
    """``(values, indices)`` of the ``k`` largest entries along ``dim`` (torch's topk)."""
    return reduce.topk(self, k, dim, largest, sorted)


# ---- shapes and views (shape.py, views.py) ----------------------------------------------------

def dim(self: Tensor) -> int:
    """Number of dims (torch's name for ``ndim``)."""
    return int(self.array.ndim)


def numel(self: Tensor) -> int:
    return int(self.array.size)


def reshape(self: Tensor, *shape: Any) -> Tensor:
    return shape_ops.reshape(self, *shape)


def view(self: Tensor, *shape: Any) -> Tensor:
    """torch's ``view``: ``reshape`` (NumPy returns a view whenever the layout allows)."""
    return shape_ops.reshape(self, *shape)


def view_as(self: Tensor, other: Tensor) -> Tensor:
    return shape_ops.reshape(self, other.shape)


def flatten(self: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    return shape_ops.flatten(self, start_dim, end_dim)


def unsqueeze(self: Tensor, dim: int) -> Tensor:
    return shape_ops.unsqueeze(self, dim)


def squeeze(self: Tensor, dim: Any = None) -> Tensor:
    return shape_ops.squeeze(self, dim)


def transpose(self: Tensor, *axes: Any) -> Tensor:
    """torch's ``transpose(dim0, dim1)`` (two ints: swap those dims, any rank), or NumPy's
    ``transpose(*axes)`` (a full permutation; none: reverse the dims, like ``.T``)."""
    if len(axes) == 2 and isinstance(axes[0], int) and isinstance(axes[1], int):
        return shape_ops.swapaxes(self, *axes)
    return shape_ops.transpose(self, *axes)


def permute(self: Tensor, *dims: Any) -> Tensor:
    """Reorder all dims (``x.permute(0, 2, 1, 3)``)."""
    return shape_ops.transpose(self, *dims)


def reversed_dims(self: Tensor) -> Tensor:
    """``x.T`` (a property): the dims reversed."""
    return shape_ops.transpose(self)


def tril(self: Tensor, diagonal: int = 0) -> Tensor:
    return shape_ops.tril(self, diagonal)


def triu(self: Tensor, diagonal: int = 0) -> Tensor:
    return shape_ops.triu(self, diagonal)


def split(self: Tensor, split_size_or_sections: Any, dim: int = 0) -> tuple[Tensor, ...]:
    return shape_ops.split(self, split_size_or_sections, dim)


def chunk(self: Tensor, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
    return shape_ops.chunk(self, chunks, dim)


def contiguous(self: Tensor) -> Tensor:
    """Self: layouts are NumPy's business here (ops copy when they need to)."""
    return self


def diagonal(self: Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
    return views.diagonal(self, offset, dim1, dim2)


def narrow(self: Tensor, dim: int, start: int, length: int) -> Tensor:
    return views.narrow(self, dim, start, length)


def expand(self: Tensor, *sizes: Any) -> Tensor:
    return views.expand(self, *sizes)


def expand_as(self: Tensor, other: Any) -> Tensor:
    return views.expand_as(self, other)


def t(self: Tensor) -> Tensor:
    return views.t(self)


# ---- fused ops and sampling (functional.py, creation.py) --------------------------------------

def softmax(self: Tensor, dim: int | None = -1, *, axis: int | None = None) -> Tensor:
    return functional.softmax(self, dim, axis=axis)


def log_softmax(self: Tensor, dim: int | None = -1, *, axis: int | None = None) -> Tensor:
    return functional.log_softmax(self, dim, axis=axis)


def multinomial(self: Tensor, num_samples: int, replacement: bool = False,
                generator: Any = None) -> Tensor:
    return creation.multinomial(self, num_samples, replacement, generator)


# ---- new tensors like this one (torch's new_*: this dtype and device by default) -------------

def defaults_from(t: Tensor, dtype: Any, device: Any, requires_grad: bool) -> dict:
    """The keyword arguments of a creation function, defaulting to ``t``'s dtype and device."""
    return {"dtype": t.array.dtype if dtype is None else dtype,
            "device": t.device if device is None else device,
            "requires_grad": requires_grad}


def new_zeros(self: Tensor, *size: Any, dtype: Any = None, device: Any = None,
              requires_grad: bool = False) -> Tensor:
    return creation.zeros(*size, **defaults_from(self, dtype, device, requires_grad))


def new_ones(self: Tensor, *size: Any, dtype: Any = None, device: Any = None,
             requires_grad: bool = False) -> Tensor:
    return creation.ones(*size, **defaults_from(self, dtype, device, requires_grad))


def new_empty(self: Tensor, *size: Any, dtype: Any = None, device: Any = None,
              requires_grad: bool = False) -> Tensor:
    return creation.empty(*size, **defaults_from(self, dtype, device, requires_grad))


def new_full(self: Tensor, size: Any, fill_value: Any, *, dtype: Any = None, device: Any = None,
             requires_grad: bool = False) -> Tensor:
    return creation.full(size, fill_value, **defaults_from(self, dtype, device, requires_grad))


def new_tensor(self: Tensor, data: Any, *, dtype: Any = None, device: Any = None,
               requires_grad: bool = False) -> Tensor:
    return creation.tensor(data, **defaults_from(self, dtype, device, requires_grad))


# The method name -> the function; core.py attaches these to Tensor.
METHODS: dict[str, Any] = {
    # the op itself where its signature is torch's method's (self first): Tensor.exp is
    # elementwise.exp
    "exp": elementwise.exp, "log": elementwise.log, "tanh": elementwise.tanh,
    "sigmoid": elementwise.sigmoid, "relu": elementwise.relu, "gelu": elementwise.gelu,
    "pow": elementwise.pow, "clamp": mathops.clamp, "clip": mathops.clamp,
    "sqrt": mathops.sqrt, "abs": mathops.abs, "sign": mathops.sign, "sin": mathops.sin,
    "cos": mathops.cos,
    "add": add, "sub": sub, "mul": mul, "div": div, "addcmul": addcmul, "addcdiv": addcdiv,
    "norm": norm, "where": where, "trace": trace, "clone": clone,
    "masked_fill": masked_fill,
    "eq": eq, "ne": ne, "all": all, "any": any,
    "sum": sum, "mean": mean, "max": max, "min": min, "argmax": argmax, "argmin": argmin,
    "topk": topk,
    "dim": dim, "numel": numel, "reshape": reshape, "view": view, "view_as": view_as,
    "flatten": flatten, "unsqueeze": unsqueeze, "squeeze": squeeze, "transpose": transpose,
    "permute": permute, "T": property(reversed_dims), "tril": tril, "triu": triu,
    "split": split, "chunk": chunk, "contiguous": contiguous, "diagonal": diagonal,
    "narrow": narrow, "expand": expand, "expand_as": expand_as, "t": t,
    "softmax": softmax, "log_softmax": log_softmax, "multinomial": multinomial,
    "new_zeros": new_zeros, "new_ones": new_ones, "new_empty": new_empty, "new_full": new_full,
    "new_tensor": new_tensor,
}
