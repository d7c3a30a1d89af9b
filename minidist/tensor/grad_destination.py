"""Where a leaf's gradient is written: a reserved buffer, and the ops that write it in place.

The backward walk (autograd.py) only accumulates: the first contribution of a backward is
stored in ``leaf.grad``, the next ones are added into it. This module holds what lets that
happen without extra copies; the walk asks it one thing (``store_first``), and the ops that
can compute a leaf's whole gradient in one go ask it the other two::

    leaf.grad_destination = GradDestination(buffer)   # DDP: the parameter's bucket slot

    in an op's backward (linear, 2-D matmul):
        gw = write_leaf_grad(weight, lambda out, scale: mm(g.T, x, out, scale))
                  # into the reserved buffer (claimed), else a fresh array that IS .grad

    in the walk, for any other op's gradient:
        store_first(leaf, g)                          # into the buffer (one pass), or a copy

A claimed destination (or an adopted array) becomes ``leaf.grad`` at once, so the walk finds
the op's result already in place (``g is leaf.grad``) and adds nothing; a second use of the
same leaf in the same op gets no claim and is added onto it. Claims and adoption are off while
``autograd.grad()`` runs (``capturing``): it returns gradients and never touches ``.grad`` or
a destination.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from minidist import xp as backend
from minidist.tensor.core import Tensor, error



class GradDestination:
    """A buffer reserved for a leaf's gradient, so backward writes it there without a copy.

    Assign it with ``leaf.grad_destination = GradDestination(buffer, scale)``. Backward then
    treats the leaf like this (torch's in-place accumulation, plus a place for the first
    write)::

        leaf.grad is None     ->  buffer[...] = scale * gradient;  leaf.grad = buffer
                                  (ops that can, e.g. linear's weight GEMM, write it there
                                  directly: see ``claim_grad_destination``)
        leaf.grad is an array ->  leaf.grad += scale * gradient    (in place, never rebound)

    So ``zero_grad(set_to_none=True)`` costs nothing and loses nothing: the next backward
    fills the same buffer again, and ``leaf.grad`` is the same Tensor again (``grad``, as
    torch's bucket views: no new object per step). DDP reserves each parameter's slot of
    its bucket (scale 1); its opt-in fast path ``hooks.prescaled_allreduce_hook`` sets
    ``scale = 1/n`` to fold the average into this write.

    Args:
        buffer: a writable, C-contiguous float array of the leaf's shape (its dtype may differ
            from the leaf's: the write casts).
        scale: every gradient contribution is multiplied by it (1.0: stored as computed).

    Attributes:
        grad: the Tensor over ``buffer`` that ``leaf.grad`` returns while the buffer is the
            gradient. Made once; made anew only if ``leaf.grad.data = t`` moved it off the
            buffer (``_install``).

    Example::

        >>> import numpy as np
        >>> from minidist.tensor import GradDestination, Tensor
        >>> w = Tensor(np.ones((2, 3), np.float32), requires_grad=True)
        >>> flat = np.zeros(6, np.float32)              # e.g. one slot of a larger buffer
        >>> w.grad_destination = GradDestination(flat.reshape(2, 3), scale=0.5)
        >>> (w * 4.0).sum().backward()
        >>> bool(np.shares_memory(w.grad, flat)), flat.tolist()
        (True, [2.0, 2.0, 2.0, 2.0, 2.0, 2.0])
        >>> g = w.grad
        >>> w.grad = None                               # zero_grad(set_to_none=True)
        >>> (w * 4.0).sum().backward()
        >>> w.grad is g                                 # the same Tensor, the same memory
        True
    """

    __slots__ = ("buffer", "scale", "grad")

    def __init__(self, buffer: Any, scale: float = 1.0) -> None:
        flags = getattr(buffer, "flags", None)
        if flags is None or not flags.c_contiguous or not getattr(flags, "writeable", True) \
                or buffer.dtype.kind != "f":
            raise ValueError(error(
                "GradDestination", "the buffer must be a writable, C-contiguous float array, got "
                f"{type(buffer).__name__} {getattr(buffer, 'dtype', '?')}. Pass a contiguous "
                "slice of a flat float buffer, reshaped to the tensor's shape."))
        self.buffer = buffer
        self.scale = float(scale)
        self.grad = Tensor(buffer)  # shares the buffer (as detach)

    def __repr__(self) -> str:
        return (f"GradDestination(shape={tuple(self.buffer.shape)}, dtype={self.buffer.dtype}, "
                f"scale={self.scale})")


class _Capturing(threading.local):
    """Per thread: how many ``autograd.grad()`` walks are running on it. While one is, no op
    may claim a destination or adopt an array into ``.grad``: ``grad()`` only returns
    gradients. Outside of it (``backward()``) claims are on."""

    def __init__(self) -> None:
        self.depth = 0


capturing = _Capturing()


def claim_grad_destination(tensor: Tensor) -> GradDestination | None:
    """For an op's backward: the buffer to write ``tensor``'s gradient into, or None.

    Non-None only when ``tensor`` is a leaf with a ``GradDestination``, its ``.grad`` is None
    and no ``autograd.grad()`` walk is running (``capturing``). The buffer becomes
    ``tensor.grad`` at once (so a second claim in this backward gets None). The op
    MUST write ``scale * gradient`` into ``dest.buffer`` and return ``dest.buffer`` itself
    as that input's gradient; the walk then finds it in place::

        dest = claim_grad_destination(weight)
        gw = mm(g2.T, x2) if dest is None else mm(g2.T, x2, out=dest.buffer, scale=dest.scale)
    """
    dest = tensor._grad_dest
    if dest is None or tensor._grad is not None or capturing.depth:
        return None
    _install(tensor, dest)
    return dest


def _install(leaf: Tensor, dest: GradDestination) -> None:
    """``dest.buffer`` becomes ``leaf.grad``, shown as ``dest.grad`` (the same Tensor every
    backward). A ``dest.grad`` that ``leaf.grad.data = t`` moved off the buffer is replaced:
    reused, ``.grad`` would adopt ``t`` again instead of this backward's gradient."""
    if dest.grad.array is not dest.buffer:
        dest.grad = Tensor(dest.buffer)
    leaf._grad, leaf._grad_view = dest.buffer, dest.grad


def write_leaf_grad(leaf: Tensor, compute: Callable[[Any, float], Any]) -> Any:
    """For an op's backward that computes ``leaf``'s whole gradient in one go.

    ``compute(out, scale)`` must return ``scale * gradient``: written into ``out`` and
    returning ``out`` itself, or, called with ``(None, 1.0)``, as a fresh array. The leaf's
    reserved buffer is claimed when it can be (``claim_grad_destination``); otherwise the
    fresh array becomes ``.grad`` when it may (``adopt_grad``). Either way the op returns
    the result as the leaf's gradient::

        gw = write_leaf_grad(weight, lambda out, scale: mm(g2.T, x2, out, scale))
    """
    dest = claim_grad_destination(leaf)
    if dest is None:
        return adopt_grad(leaf, compute(None, 1.0))
    return compute(dest.buffer, dest.scale)


def adopt_grad(tensor: Tensor, g: Any) -> Any:
    """For an op's backward: ``g``, a fresh array only this op made, becomes ``tensor.grad``
    without a copy when it is the leaf's first gradient of a ``backward()`` (not of an
    ``autograd.grad()`` walk) and has the leaf's dtype. Returns ``g`` (the op returns it as
    usual)."""
    if (tensor._grad is None and tensor._grad_dest is None and not capturing.depth
            and g.dtype == tensor.array.dtype and g.shape == tensor.array.shape):
        tensor._grad = g
    return g


def store_first(leaf: Tensor, g: Any) -> None:
    """Make ``leaf.grad`` hold its first contribution ``g``: its reserved buffer, written with
    ``scale * g`` (``_install``), else a copy of ``g`` the leaf owns (an op may keep ``g``)."""
    dest = leaf._grad_dest
    if dest is None:
        leaf._grad = g.astype(leaf.array.dtype, copy=True)
        return
    xp = backend.get_array_module(dest.buffer)
    if dest.scale == 1.0:
        xp.copyto(dest.buffer, g, casting="unsafe")
    else:
        xp.multiply(g, dest.scale, out=dest.buffer, casting="unsafe")
    _install(leaf, dest)


def scale_of(leaf: Tensor) -> float:
    """The factor every contribution to ``leaf``'s gradient is multiplied by (1.0 without a
    destination)."""
    dest = leaf._grad_dest
    return 1.0 if dest is None else dest.scale


__all__ = ["GradDestination", "adopt_grad", "capturing", "claim_grad_destination", "scale_of",
           "store_first", "write_leaf_grad"]
