"""torch's indexing, sorting and repeating ops, with torch's meaning where NumPy's method of the
same name differs: gather, scatter, index_add, take, index_select, sort, argsort, repeat,
repeat_interleave, maximum/minimum, nonzero.

    logits.gather(1, y[:, None])          # torch.gather: pick one entry per row
    x.repeat(4, 1)                        # torch: tile (shape (1, 5) -> (4, 5)); NumPy's
                                          #   ndarray.repeat repeats elements ((1, 5) -> (1, 20))
    values, idx = x.sort(dim=1, descending=True)

Gradients: gather/take/index_select scatter-add the output gradient back into zeros of the
input's shape (repeated indices add up); sort's values are a gather of the input; repeat sums
the tiles; maximum/minimum send the gradient to the larger/smaller input (half to each on a
tie, as torch). Indices (argsort, sort's indices, nonzero) are int64 and off the tape.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy

from minidist import xp as backend
from minidist.tensor.core import Tensor, error
from minidist.tensor.elementwise import coerce, unbroadcast


def _dim(op: str, dim: int, ndim: int) -> int:
    if not -max(ndim, 1) <= dim < max(ndim, 1):
        raise IndexError(error(op, f"dim {dim} is out of range for a {ndim}-d tensor "
                               f"(valid: {-ndim}..{ndim - 1})."))
    return dim % max(ndim, 1)


def _index_array(index: Any, like: Any) -> Any:
    xp = backend.get_array_module(like)
    idx = index.array if isinstance(index, Tensor) else index
    idx = xp.asarray(idx)
    if idx.dtype.kind not in "iu":
        raise TypeError(error("index", f"indices must be integers (int64), got {idx.dtype}."))
    return idx.astype(numpy.int64, copy=False)


def _scatter_add(shape: tuple[int, ...], where: tuple, g: Any) -> Any:
    """Zeros of ``shape`` with ``g`` added at ``where`` (repeated positions add up)."""
    xp = backend.get_array_module(g)
    out = xp.zeros(shape, dtype=g.dtype)
    if xp is numpy:
        numpy.add.at(out, where, g)
    else:  # CuPy: its scatter_add is the same unbuffered add
        import cupyx  # noqa: PLC0415 - only with CuPy

        cupyx.scatter_add(out, where, g)
    return out


def gather(input: Tensor, dim: int, index: Any) -> Tensor:  # noqa: A002 - torch's name
    """torch's ``gather``: ``out[i][j] = input[index[i][j]][j]`` for dim 0, and so on.

    ``index`` has the input's number of dims and may be smaller than it in the other dims."""
    x = input.array
    d = _dim("gather", dim, x.ndim)
    idx = _index_array(index, x)
    if idx.ndim != x.ndim:
        raise ValueError(error("gather", f"index has {idx.ndim} dims, the input {x.ndim}; "
                               "they must have the same number of dims (add one with [:, None])."))
    xp = backend.get_array_module(x)
    grid = list(xp.ogrid[tuple(slice(0, n) for n in idx.shape)]) if idx.ndim else []
    grid[d] = idx
    where = tuple(grid)
    out = x[where]
    return Tensor._make(out, (input,), lambda g: (_scatter_add(x.shape, where, g),), "gather")


def _scatter_where(op: str, x: Any, dim: int, index: Any) -> tuple:
    """The positions ``scatter``/``gather`` address: ``index`` along ``dim``, a grid elsewhere."""
    d = _dim(op, dim, x.ndim)
    idx = _index_array(index, x)
    if idx.ndim != x.ndim:
        raise ValueError(error(op, f"index has {idx.ndim} dims, the tensor {x.ndim}; they must "
                               "have the same number of dims."))
    xp = backend.get_array_module(x)
    grid = list(xp.ogrid[tuple(slice(0, n) for n in idx.shape)]) if idx.ndim else []
    grid[d] = idx
    return tuple(grid)


def scatter(input: Tensor, dim: int, index: Any, src: Any = None, *,  # noqa: A002
            value: Any = None, reduce: str | None = None) -> Tensor:
    """torch's out-of-place ``scatter``: a copy with ``src`` (a tensor of ``index``'s shape
    or larger, or a number ``value``) written at ``index`` along ``dim``
    (``zeros(n, c).scatter(1, y[:, None], 1.0)`` is a one-hot). With ``reduce="add"`` the
    values are added instead. The gradient reaches the input where nothing was written (all
    of it with "add") and ``src`` at the positions it wrote."""
    x = input.array
    where = _scatter_where("scatter", x, dim, index)
    fill = src if src is not None else value
    if reduce not in (None, "add"):
        raise ValueError(error("scatter", f"reduce={reduce!r}: only None and 'add' are "
                               "supported."))
    xp = backend.get_array_module(x)
    out = x.copy()
    parents: tuple = (input,)
    part = tuple(slice(0, n) for n in where[dim % x.ndim].shape)  # src's part that is written
    if isinstance(fill, Tensor):
        parents = (input, fill)
        vals = fill.array[part] if fill.ndim else xp.broadcast_to(fill.array, where[dim].shape)
    else:
        vals = fill
    if reduce == "add":
        if xp is numpy:
            numpy.add.at(out, where, vals)
        else:
            import cupyx  # noqa: PLC0415

            cupyx.scatter_add(out, where, vals)
    else:
        out[where] = vals
    # where an index repeats, one write wins (the last, as torch's CPU kernel): only the
    # winning src element reaches the output, so only it gets a gradient
    ids = xp.arange(where[dim % x.ndim].size).reshape(where[dim % x.ndim].shape)
    won = None
    if reduce is None:
        seen = xp.full(x.shape, -1, dtype=ids.dtype)
        seen[where] = ids
        won = seen[where] == ids

    def backward(g: Any) -> tuple:
        gx = g.copy()
        if reduce is None:
            gx[where] = 0
        if len(parents) == 1:
            return (gx,)
        picked = g[where] if won is None else g[where] * won
        gsrc = xp.zeros(fill.shape, dtype=g.dtype)
        if fill.ndim:
            gsrc[part] = picked
        else:
            gsrc[...] = picked.sum()
        return gx, gsrc

    return Tensor._make(out, parents, backward, "scatter")


def index_add(input: Tensor, dim: int, index: Any, source: Any, *,  # noqa: A002
              alpha: Any = 1) -> Tensor:
    """torch's ``index_add``: ``source``'s slices added to the input's entries ``index`` (1-D)
    along ``dim`` (repeated indices add up); gradients to both."""
    x = input.array
    d = _dim("index_add", dim, x.ndim)
    idx = _index_array(index, x).reshape(-1)
    src = source if isinstance(source, Tensor) else Tensor(source)
    where = (slice(None),) * d + (idx,)
    out = x + _scatter_add(x.shape, where, src.array * alpha).astype(x.dtype, copy=False)
    return Tensor._make(out, (input, src), lambda g: (g, g[where] * alpha), "index_add")


def take(input: Tensor, index: Any) -> Tensor:  # noqa: A002
    """torch's ``take``: the input as if flattened, at ``index`` (the result has its shape)."""
    x = input.array
    idx = _index_array(index, x)
    flat = idx % max(x.size, 1)

    def backward(g: Any) -> tuple:
        return (_scatter_add((x.size,), (flat.reshape(-1),), g.reshape(-1)).reshape(x.shape),)

    return Tensor._make(x.reshape(-1)[flat], (input,), backward, "take")


def index_select(input: Tensor, dim: int, index: Any) -> Tensor:  # noqa: A002
    """torch's ``index_select``: the entries ``index`` (1-D) of dim ``dim``."""
    x = input.array
    d = _dim("index_select", dim, x.ndim)
    idx = _index_array(index, x).reshape(-1)
    where = (slice(None),) * d + (idx,)

    def backward(g: Any) -> tuple:
        return (_scatter_add(x.shape, where, g),)

    return Tensor._make(x[where], (input,), backward, "index_select")


class SortResult(NamedTuple):
    """torch's ``sort`` result: ``values, indices = x.sort(dim)``."""

    values: Tensor
    indices: Tensor


def argsort(input: Tensor, dim: int = -1, descending: bool = False,  # noqa: A002
            stable: bool = False) -> Tensor:
    """torch's ``argsort``: indices that sort along ``dim`` (int64, off the tape); ties keep
    their order (a stable sort, which torch's ``stable=False`` also allows)."""
    x = input.array
    xp = backend.get_array_module(x)
    if x.ndim == 0:
        return Tensor(xp.zeros((), dtype=numpy.int64))
    d = _dim("argsort", dim, x.ndim)
    if descending:
        key = -x.astype(numpy.float64) if x.dtype.kind in "uib" else -x
        idx = xp.argsort(key, axis=d, kind="stable")
    else:
        idx = xp.argsort(x, axis=d, kind="stable")
    return Tensor(idx.astype(numpy.int64, copy=False))


def sort(input: Tensor, dim: int = -1, descending: bool = False,  # noqa: A002
         stable: bool = False) -> SortResult:
    """torch's ``sort``: ``(values, indices)`` along ``dim`` (NumPy's ``ndarray.sort`` sorts in
    place and returns None). The values are differentiable."""
    idx = argsort(input, dim, descending, stable)
    if input.ndim == 0:
        return SortResult(input * 1, idx)
    return SortResult(gather(input, dim, idx), idx)


def repeat(input: Tensor, *sizes: Any) -> Tensor:  # noqa: A002
    """torch's ``Tensor.repeat``: tile the tensor ``sizes[i]`` times along dim i (NumPy's
    ``tile``; NumPy's ``ndarray.repeat`` repeats each element instead, torch's
    ``repeat_interleave``). ``sizes`` may have more dims than the tensor (new leading dims)."""
    if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)):
        sizes = tuple(sizes[0])
    sizes = tuple(int(s) for s in sizes)
    x = input.array
    if len(sizes) < x.ndim:
        raise ValueError(error("repeat", f"{len(sizes)} repeat sizes for a {x.ndim}-d tensor: "
                               "give one per dim (more adds leading dims), as torch."))
    xp = backend.get_array_module(x)
    shape = (1,) * (len(sizes) - x.ndim) + tuple(x.shape)
    out = xp.tile(x.reshape(shape), sizes)

    def backward(g: Any) -> tuple:
        split = [v for pair in zip(sizes, shape) for v in pair]
        return (g.reshape(split).sum(axis=tuple(range(0, 2 * len(sizes), 2))).reshape(x.shape),)

    return Tensor._make(out, (input,), backward, "repeat")


def repeat_interleave(input: Tensor, repeats: Any, dim: int | None = None) -> Tensor:  # noqa: A002
    """torch's ``repeat_interleave`` (NumPy's ``repeat``): each element ``repeats`` times along
    ``dim`` (flattened when None); ``repeats`` an int or one count per element."""
    x = input.array if dim is not None else input.array.reshape(-1)
    d = 0 if dim is None else _dim("repeat_interleave", dim, x.ndim)
    xp = backend.get_array_module(x)
    reps = repeats.array if isinstance(repeats, Tensor) else repeats
    out = xp.repeat(x, reps, axis=d)
    src = xp.repeat(xp.arange(x.shape[d]), reps)
    shape = input.array.shape

    def backward(g: Any) -> tuple:
        gx = xp.zeros(x.shape, dtype=g.dtype)
        moved = xp.moveaxis(gx, d, 0)
        if xp is numpy:
            numpy.add.at(moved, src, xp.moveaxis(g, d, 0))
        else:
            import cupyx  # noqa: PLC0415

            cupyx.scatter_add(moved, src, xp.moveaxis(g, d, 0))
        return (gx.reshape(shape),)

    return Tensor._make(out, (input,), backward, "repeat_interleave")


def _extremum(op: str, a: Tensor, b: Any, pick: Any) -> Tensor:
    b = coerce(b, a)
    bt = b if isinstance(b, Tensor) else Tensor(b)
    xa, xb = a.array, bt.array
    out = pick(xa, xb)
    a_wins = (xa > xb) if op == "maximum" else (xa < xb)

    def backward(g: Any) -> tuple:
        tie = (xa == xb) * 0.5
        wa = a_wins + tie
        wb = 1 - a_wins - tie
        return unbroadcast(g * wa, xa.shape), unbroadcast(g * wb, xb.shape)

    return Tensor._make(out, (a, bt), backward, op)


def maximum(input: Tensor, other: Any) -> Tensor:  # noqa: A002
    """Elementwise maximum (torch's ``maximum``, and ``x.max(other)``)."""
    return _extremum("maximum", input, other, backend.get_array_module(input.array).maximum)


def minimum(input: Tensor, other: Any) -> Tensor:  # noqa: A002
    """Elementwise minimum (torch's ``minimum``, and ``x.min(other)``)."""
    return _extremum("minimum", input, other, backend.get_array_module(input.array).minimum)


def kthvalue(input: Tensor, k: int, dim: int = -1, keepdim: bool = False  # noqa: A002
             ) -> SortResult:
    """torch's ``kthvalue``: the ``k``-th smallest (1-based) along ``dim`` and where it is;
    the value is differentiable (a gather)."""
    d = _dim("kthvalue", dim, input.ndim)
    if not 1 <= k <= input.shape[d]:
        raise IndexError(error("kthvalue", f"k={k} is out of range for dim {d} of size "
                               f"{input.shape[d]} (1..{input.shape[d]})."))
    xp = backend.get_array_module(input.array)
    order = argsort(input, d).array
    idx = xp.take(order, [k - 1], axis=d)
    values = gather(input, d, idx)
    if not keepdim:
        values, idx = values.squeeze(d), idx.squeeze(d)
    return SortResult(values, Tensor(idx))


def median(input: Tensor, dim: int | None = None, keepdim: bool = False) -> Any:  # noqa: A002
    """torch's ``median``: the lower of the two middle values (NumPy's ``median`` averages
    them); over all elements a 0-d tensor, along ``dim`` ``(values, indices)``."""
    if dim is None:
        flat = input.reshape(-1)
        return kthvalue(flat, (flat.shape[0] + 1) // 2, 0).values
    n = input.shape[_dim("median", dim, input.ndim)]
    return kthvalue(input, (n + 1) // 2, dim, keepdim)


def unique(input: Tensor, sorted: bool = True, return_inverse: bool = False,  # noqa: A002
           return_counts: bool = False, dim: int | None = None) -> Any:
    """torch's ``unique`` (sorted, off the tape): the distinct values, and with
    ``return_inverse``/``return_counts`` where each element went and how many there were."""
    xp = backend.get_array_module(input.array)
    out = xp.unique(input.array, return_inverse=return_inverse, return_counts=return_counts,
                    axis=dim)
    if not (return_inverse or return_counts):
        return Tensor(out)
    values, *rest = out
    if return_inverse:
        rest[0] = rest[0].reshape(input.shape if dim is None else (-1,)).astype(numpy.int64)
    return (Tensor(values), *[Tensor(r.astype(numpy.int64)) for r in rest])


def nonzero(input: Tensor, *, as_tuple: bool = False) -> Any:  # noqa: A002
    """torch's ``nonzero``: an (n, ndim) int64 tensor of the non-zero positions (NumPy's
    ``ndarray.nonzero`` returns a tuple of arrays: torch's ``as_tuple=True``)."""
    xp = backend.get_array_module(input.array)
    where = xp.nonzero(input.array)
    if as_tuple:
        return tuple(Tensor(w.astype(numpy.int64)) for w in where)
    return Tensor(xp.stack(where, axis=-1).astype(numpy.int64).reshape(-1, input.array.ndim))


__all__ = ["gather", "scatter", "index_add", "take", "index_select", "SortResult", "argsort",
           "sort", "repeat", "repeat_interleave", "maximum", "minimum", "nonzero", "kthvalue",
           "median", "unique"]
