"""Views of a tensor: diagonal, narrow, expand/expand_as, t (torch's names).

    torch.diagonal(c).add_(-1)          # Barlow Twins: the diagonal of a matrix
    x.narrow(1, 0, 3)                   # x[:, 0:3]
    bias.expand_as(out)                 # broadcast to another tensor's shape

Each result's array is a NumPy/CuPy view of the input's (no copy), so an in-place write into a
view of a tensor outside the tape reaches the tensor, as in torch; ``expand``'s view is
read-only (its elements alias each other). The gradient of each goes back to the input's
shape: scattered into zeros (diagonal, narrow) or summed over the broadcast dims (expand).
"""

from __future__ import annotations

from typing import Any

from minidist import xp as backend
from minidist.tensor.core import Tensor, error
from minidist.tensor.elementwise import unbroadcast


def diagonal(input: Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:  # noqa: A002
    """The diagonal (``offset`` above it for > 0) over dims ``dim1``, ``dim2``, as the last dim.

    A writable view: ``minidist.diagonal(x).fill_(0)`` under ``no_grad`` zeroes x's diagonal.
    """
    x = input.data
    out = x.diagonal(offset, dim1, dim2)
    if hasattr(out, "flags") and not out.flags.writeable and x.flags.writeable:
        out.setflags(write=True)  # NumPy marks diagonal views read-only; torch's are writable

    def backward(g: Any) -> tuple:
        xp = backend.get_array_module(g)
        gx = xp.zeros(x.shape, dtype=g.dtype)
        view = gx.diagonal(offset, dim1, dim2)
        if hasattr(view, "flags") and not view.flags.writeable:
            view.setflags(write=True)
        view[...] = g
        return (gx,)

    return Tensor._make(out, (input,), backward, "diagonal")


def narrow(input: Tensor, dim: int, start: int, length: int) -> Tensor:  # noqa: A002
    """``length`` entries of dim ``dim`` from ``start``: ``x[..., start:start + length, ...]``."""
    ndim = input.ndim
    if not -ndim <= dim < ndim:
        raise IndexError(error("narrow", f"dim {dim} out of range for a {ndim}-d tensor."))
    dim %= ndim
    size = input.shape[dim]
    start = int(start) + (size if int(start) < 0 else 0)
    if length < 0 or not 0 <= start <= size - length:
        raise IndexError(error("narrow", f"start {start} + length {length} exceeds dim {dim} "
                               f"of size {size}."))
    index = (slice(None),) * dim + (slice(start, start + int(length)),)
    return input[index]


def expand(input: Tensor, *sizes: Any) -> Tensor:  # noqa: A002
    """Broadcast to ``sizes`` (``-1`` keeps a dim); a read-only view, summed back in backward."""
    if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)):
        sizes = tuple(sizes[0])
    shape = input.shape
    if len(sizes) < len(shape):
        raise ValueError(error("expand", f"the number of sizes ({len(sizes)}) must be at least "
                               f"the number of dims ({len(shape)})."))
    lead = len(sizes) - len(shape)
    target = tuple(int(s) if s != -1 else shape[i - lead] for i, s in enumerate(sizes))
    xp = backend.get_array_module(input.data)
    try:
        out = xp.broadcast_to(input.data, target)
    except ValueError:
        raise ValueError(error("expand", f"cannot expand shape {shape} to {target}: a dim can "
                               "only grow from size 1.")) from None
    return Tensor._make(out, (input,), lambda g: (unbroadcast(g, shape),), "expand")


def expand_as(input: Tensor, other: Any) -> Tensor:  # noqa: A002
    """``expand`` to ``other``'s shape."""
    return expand(input, *tuple(other.shape))


def t(input: Tensor) -> Tensor:  # noqa: A002
    """Transpose a tensor of at most 2 dims (torch's ``t``): 0-d and 1-d come back as they are."""
    if input.ndim > 2:
        raise ValueError(error("t", f"expects a tensor with <= 2 dims, got {input.ndim}. Use "
                               "transpose(dim0, dim1) or permute."))
    return input if input.ndim < 2 else input.transpose(0, 1)
