"""Shape ops: reshape, flatten, transpose, indexing, cat/concatenate, stack, split/chunk,
tril/triu.

None of these computes; their backward moves the gradient back to where each element came from:
reshape reshapes it back, transpose applies the inverse permutation, tril/triu keep the same
triangle of it, indexing scatters it into zeros (``xp.add.at`` for integer-array indices, where
one element may be picked twice), and cat/stack slice it into the pieces (split is slicing).
"""

from __future__ import annotations

from typing import Any, Sequence

from minidist import xp as backend
from minidist.tensor.core import Tensor, error
from minidist.tensor.grad_mode import is_grad_enabled


def reshape(x: Tensor, *shape: Any) -> Tensor:
    """Reshape to ``shape`` (ints or one tuple; one entry may be -1)."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    try:
        out = x.array.reshape(shape)
    except ValueError:
        raise ValueError(error("reshape", f"cannot reshape a tensor of shape {x.shape} "
                               f"({x.size} elements) into shape {tuple(shape)}. The number of "
                               "elements must stay the same.")) from None
    src = x.array.shape
    return Tensor._make(out, (x,), lambda g: (g.reshape(src),), "reshape")


def flatten(x: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    """Merge dims ``start_dim..end_dim`` into one (``flatten(1)``: (N, C, H, W) -> (N, C*H*W))."""
    if x.ndim == 0:
        return reshape(x, 1)
    start, end = start_dim % x.ndim, end_dim % x.ndim
    return reshape(x, *x.shape[:start], -1, *x.shape[end + 1:])


def unsqueeze(x: Tensor, dim: int) -> Tensor:
    """Insert a size-1 dim at ``dim`` (negative counts from the end of the RESULT, as torch)."""
    if not -x.ndim - 1 <= dim <= x.ndim:
        raise ValueError(error("unsqueeze", f"dim {dim} is out of range for a tensor with "
                               f"{x.ndim} dims (valid: {-x.ndim - 1}..{x.ndim})."))
    dim = dim % (x.ndim + 1)
    return reshape(x, *x.shape[:dim], 1, *x.shape[dim:])


def squeeze(x: Tensor, dim: Any = None) -> Tensor:
    """Drop size-1 dims (all, or only ``dim`` if it has size 1; torch leaves others alone)."""
    if dim is None:
        dims = {i for i, n in enumerate(x.shape) if n == 1}
    else:
        dims = {d % x.ndim for d in ((dim,) if isinstance(dim, int) else dim)
                if x.ndim and x.shape[d % x.ndim] == 1}
    return reshape(x, *[n for i, n in enumerate(x.shape) if i not in dims])


def transpose(x: Tensor, *axes: Any) -> Tensor:
    """Permute axes (reverse them when none are given, like ``.T``)."""
    if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
        axes = tuple(axes[0])
    if not axes:
        axes = tuple(range(x.ndim - 1, -1, -1))
    if sorted(a % x.ndim for a in axes) != list(range(x.ndim)):
        raise ValueError(error("transpose", f"axes {axes} are not a permutation of the "
                               f"{x.ndim} dims of a tensor of shape {x.shape}."))
    axes = tuple(a % x.ndim for a in axes)
    inverse = tuple(sorted(range(x.ndim), key=lambda i: axes[i]))
    out = x.array.transpose(axes)
    return Tensor._make(out, (x,), lambda g: (g.transpose(inverse),), "transpose")


def swapaxes(x: Tensor, dim0: int, dim1: int) -> Tensor:
    """Swap two dims (torch's ``transpose(dim0, dim1)``; ``x.transpose(1, 2)`` on (B, T, H, D)
    gives (B, H, T, D))."""
    for d in (dim0, dim1):
        if not -x.ndim <= d < x.ndim:
            raise ValueError(error("transpose", f"dim {d} is out of range for a tensor with "
                                   f"{x.ndim} dims (valid: {-x.ndim}..{x.ndim - 1})."))
    axes = list(range(x.ndim))
    axes[dim0], axes[dim1] = axes[dim1], axes[dim0]
    return transpose(x, axes)


def tril(x: Tensor, diagonal: int = 0) -> Tensor:
    """The lower triangle of the last two dims (``diagonal`` shifts it up), zeros above."""
    if x.ndim < 2:
        raise ValueError(error("tril", f"needs at least 2 dims, got shape {x.shape}."))
    xp = backend.get_array_module(x.array)
    return Tensor._make(xp.tril(x.array, diagonal), (x,), lambda g: (xp.tril(g, diagonal),),
                        "tril")


def triu(x: Tensor, diagonal: int = 0) -> Tensor:
    """The upper triangle of the last two dims (``diagonal`` shifts it up), zeros below."""
    if x.ndim < 2:
        raise ValueError(error("triu", f"needs at least 2 dims, got shape {x.shape}."))
    xp = backend.get_array_module(x.array)
    return Tensor._make(xp.triu(x.array, diagonal), (x,), lambda g: (xp.triu(g, diagonal),),
                        "triu")


def split(x: Tensor, split_size_or_sections: Any, dim: int = 0) -> tuple[Tensor, ...]:
    """torch's ``split``: pieces of ``split_size`` along ``dim`` (the last may be shorter), or
    of the sizes listed. Each piece is a slice on the tape (``qkv.split(C, dim=2)``)."""
    n = x.shape[dim]
    if isinstance(split_size_or_sections, int):
        size = split_size_or_sections
        if size <= 0:
            raise ValueError(error("split", f"split_size must be positive, got {size}."))
        sizes = [min(size, n - lo) for lo in range(0, n, size)] or [0]
    else:
        sizes = [int(s) for s in split_size_or_sections]
        if sum(sizes) != n:
            raise ValueError(error("split", f"sections {sizes} sum to {sum(sizes)}, but dim "
                                   f"{dim} has size {n}. They must add up to it."))
    pre = (slice(None),) * (dim % x.ndim)
    bounds = [0]
    for s in sizes:
        bounds.append(bounds[-1] + s)
    return tuple(getitem(x, pre + (slice(lo, hi),)) for lo, hi in zip(bounds[:-1], bounds[1:]))


def chunk(x: Tensor, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
    """torch's ``chunk``: ``chunks`` pieces of ``ceil(size / chunks)`` along ``dim``."""
    if chunks <= 0:
        raise ValueError(error("chunk", f"chunks must be positive, got {chunks}."))
    n = x.shape[dim]
    return split(x, max(1, -(-n // chunks)), dim)


def _index_parts(index: Any) -> tuple[Any, bool]:
    """Unwrap Tensors/lists in an index; report whether it uses integer/boolean arrays."""
    xp_mod = None
    parts = index if isinstance(index, tuple) else (index,)
    out, advanced = [], False
    for part in parts:
        if isinstance(part, Tensor):
            part = part.array
        if isinstance(part, list):
            xp_mod = xp_mod or backend.default_array_module()
            part = xp_mod.asarray(part)
        if hasattr(part, "shape") and hasattr(part, "dtype"):
            advanced = True
        out.append(part)
    return (tuple(out) if isinstance(index, tuple) else out[0]), advanced


def getitem(x: Tensor, index: Any) -> Tensor:
    """``x[index]``: basic slicing and integer/boolean-array indexing."""
    index, advanced = _index_parts(index)
    try:
        out = x.array[index]
    except IndexError as e:
        raise IndexError(error("getitem", f"{e} (tensor shape {x.shape}).")) from None

    def backward(g: Any) -> tuple:
        xp = backend.get_array_module(g)
        gx = xp.zeros(x.array.shape, dtype=g.dtype)
        if advanced:
            xp.add.at(gx, index, g)  # repeated indices add up
        else:
            gx[index] = g  # basic indexing selects each element at most once
        return (gx,)

    return Tensor._make(out, (x,), backward, "getitem")


def setitem(x: Tensor, index: Any, value: Any) -> None:
    """``x[index] = value``, in place and outside the tape (torch's in-place indexing write).

    Refused while the tape could see it: on a tensor that requires grad with grad mode on
    (``logits[logits < v] = -inf`` works under ``no_grad`` or on a plain tensor).
    """
    if x.requires_grad and is_grad_enabled():
        raise RuntimeError(error("setitem", "an in-place write into a tensor that requires grad "
                                 "would make its recorded gradient wrong. Write under "
                                 "minidist.no_grad(), or use masked_fill (recorded on the tape)."))
    index, _ = _index_parts(index)
    if isinstance(value, Tensor):
        value = value.array
    x.array[index] = backend.move(value, backend.device_of(x.array)) \
        if hasattr(value, "shape") else value


def _dim(op: str, dim: Any, axis: Any) -> int:
    """torch's ``dim=`` or NumPy's ``axis=`` (at most one)."""
    if dim is not None and axis is not None:
        raise TypeError(error(op, f"got both dim={dim!r} and axis={axis!r}; pass one."))
    return int(dim if dim is not None else (axis if axis is not None else 0))


def cat(tensors: Sequence[Tensor], dim: int | None = None, *, axis: int | None = None) -> Tensor:
    """Join tensors along an existing dim (``torch.cat(tensors, dim=0)``; ``axis=`` too)."""
    axis = _dim("cat", dim, axis)
    tensors = tuple(t if isinstance(t, Tensor) else Tensor(t) for t in tensors)
    if not tensors:
        raise ValueError(error("cat", "got an empty sequence. Pass at least one tensor."))
    xp = backend.get_array_module(*[t.array for t in tensors])
    try:
        out = xp.concatenate([t.array for t in tensors], axis=axis)
    except (ValueError, IndexError) as e:
        shapes = [t.shape for t in tensors]
        raise ValueError(error("cat", f"cannot join shapes {shapes} along axis {axis}: {e}. All "
                               "dims except the joined one must match.")) from None
    ax = axis % out.ndim
    bounds = [0]
    for t in tensors:
        bounds.append(bounds[-1] + t.array.shape[ax])

    def backward(g: Any) -> tuple:
        pre = (slice(None),) * ax
        return tuple(g[pre + (slice(lo, hi),)] for lo, hi in zip(bounds[:-1], bounds[1:]))

    return Tensor._make(out, tensors, backward, "cat")


concatenate = cat


def stack(tensors: Sequence[Tensor], dim: int | None = None, *, axis: int | None = None
          ) -> Tensor:
    """Join same-shape tensors along a new dim (``torch.stack(tensors, dim=0)``; ``axis=``)."""
    axis = _dim("stack", dim, axis)
    tensors = tuple(t if isinstance(t, Tensor) else Tensor(t) for t in tensors)
    shapes = {t.shape for t in tensors}
    if len(shapes) != 1:
        raise ValueError(error("stack", f"all tensors must have the same shape, got "
                               f"{[t.shape for t in tensors]}."))
    xp = backend.get_array_module(*[t.array for t in tensors])
    out = xp.stack([t.array for t in tensors], axis=axis)
    ax = axis % out.ndim

    def backward(g: Any) -> tuple:
        return tuple(xp.take(g, i, axis=ax) for i in range(len(tensors)))

    return Tensor._make(out, tensors, backward, "stack")
