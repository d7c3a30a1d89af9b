"""Where a leaf's gradient is written: a reserved buffer, and the ops that write it in place.

The backward walk (autograd.py) only accumulates: it hands a leaf's first contribution to
``store_first`` and adds the next ones in place. The ops that compute a leaf's whole gradient
in one go write it straight into the reserved buffer::

    leaf.grad_destination = GradDestination(buffer)   # DDP: the parameter's bucket slot
    gw = write_leaf_grad(weight, mm, g2.T, x2)        # in linear's backward: the GEMM's own
                                                      # output is the buffer (or a fresh .grad)

The buffer (or the adopted array) becomes ``leaf.grad`` at once, so the walk finds the op's
result already in place (``g is leaf.grad``) and adds nothing. Claims and adoption are off
while ``autograd.grad()`` runs (``capturing``): it returns gradients and never touches
``.grad`` or a destination.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from minidist import xp as backend
from minidist.tensor.core import Tensor, error


class GradDestination:
    """A buffer reserved for a leaf's gradient, so backward writes it there without a copy.

    Assign it with ``leaf.grad_destination = GradDestination(buffer)``. Backward then treats
    the leaf like this (torch's in-place accumulation, plus a place for the first write)::

        leaf.grad is None     ->  buffer[...] = gradient;  leaf.grad = buffer
                                  (ops that can, e.g. linear's weight GEMM, write it there
                                  directly: see ``write_leaf_grad``)
        leaf.grad is an array ->  leaf.grad += gradient    (in place, never rebound)

    So ``zero_grad(set_to_none=True)`` costs nothing and loses nothing: the next backward
    fills the same buffer again, and ``leaf.grad`` is the same Tensor again (``grad``, as
    torch's bucket views: no new object per step). DDP reserves each parameter's slot of
    its bucket. (``scaled_grad.ScaledGradDestination`` also multiplies every contribution
    by a factor: DDP's opt-in ``prescaled_allreduce_hook``.)

    Args:
        buffer: a writable, C-contiguous float array of the leaf's shape (its dtype may differ
            from the leaf's: the write casts).

    Attributes:
        grad: the Tensor over ``buffer`` that ``leaf.grad`` returns while the buffer is the
            gradient. Made once; made anew only if ``leaf.grad.data = t`` moved it off the
            buffer (``_install``).

    Example::

        >>> import numpy as np
        >>> from minidist.tensor import GradDestination, Tensor
        >>> w = Tensor(np.ones((2, 3), np.float32), requires_grad=True)
        >>> flat = np.zeros(6, np.float32)              # e.g. one slot of a larger buffer
        >>> w.grad_destination = GradDestination(flat.reshape(2, 3))
        >>> (w * 4.0).sum().backward()
        >>> bool(np.shares_memory(w.grad, flat)), flat.tolist()
        (True, [4.0, 4.0, 4.0, 4.0, 4.0, 4.0])
        >>> g = w.grad
        >>> w.grad = None                               # zero_grad(set_to_none=True)
        >>> (w * 4.0).sum().backward()
        >>> w.grad is g                                 # the same Tensor, the same memory
        True
    """

    __slots__ = ("buffer", "grad")

    def __init__(self, buffer: Any) -> None:
        flags = getattr(buffer, "flags", None)
        if flags is None or not flags.c_contiguous or not getattr(flags, "writeable", True) \
                or buffer.dtype.kind != "f":
            raise ValueError(error(
                "GradDestination", "the buffer must be a writable, C-contiguous float array, got "
                f"{type(buffer).__name__} {getattr(buffer, 'dtype', '?')}. Pass a contiguous "
                "slice of a flat float buffer, reshaped to the tensor's shape."))
        self.buffer = buffer
        self.grad = Tensor(buffer)  # shares the buffer (as detach)

    def write(self, compute: Callable[..., Any], *operands: Any, out: Any = None) -> Any:
        """``compute(*operands, out=...)``: an op's whole gradient, written into the buffer
        (or ``out``, a view of it) as the computation's own output. Returns that array."""
        return compute(*operands, out=self.buffer if out is None else out)

    def store(self, g: Any) -> None:
        """The first contribution, computed elsewhere: copied in (one pass, cast on the way)."""
        backend.get_array_module(self.buffer).copyto(self.buffer, g, casting="unsafe")

    def add(self, grad: Any, g: Any) -> None:
        """A later contribution: ``grad += g`` in place."""
        backend.get_array_module(grad).add(grad, g, out=grad, casting="unsafe")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(shape={tuple(self.buffer.shape)}, dtype={self.buffer.dtype})"


def _get_destination(self: Tensor) -> GradDestination | None:
    """``Tensor.grad_destination``: the ``GradDestination`` reserved for this leaf's gradient,
    or None (docs/tensor.md, "Gradient destinations"). Assign None to release it."""
    return self._grad_dest


def _set_destination(self: Tensor, dest: GradDestination | None) -> None:
    if dest is not None:
        if not isinstance(dest, GradDestination):
            raise TypeError(error("grad_destination", f"expected a GradDestination or None, "
                                  f"got {type(dest).__name__}. Wrap the buffer: "
                                  "GradDestination(buffer)."))
        if not self.is_leaf or not self.requires_grad:
            raise RuntimeError(error(
                "grad_destination", "only a leaf that requires grad has a gradient to "
                f"write (this one: requires_grad={self.requires_grad}, "
                f"is_leaf={self.is_leaf}). Reserve it on the parameter itself."))
        if tuple(dest.buffer.shape) != self.array.shape:
            raise ValueError(error(
                "grad_destination", f"buffer of shape {tuple(dest.buffer.shape)} for a tensor "
                f"of shape {self.array.shape}. Reshape the buffer to the tensor's shape."))
    self._grad_dest = dest


METHODS = {"grad_destination": property(_get_destination, _set_destination,
                                        doc=_get_destination.__doc__)}
"""Attached to Tensor by core.py: ``leaf.grad_destination = GradDestination(buffer)``."""


class _Capturing(threading.local):
    """Per thread: how many ``autograd.grad()`` walks are running on it. While one is, no op
    may claim a destination or adopt an array into ``.grad``: ``grad()`` only returns
    gradients. Outside of it (``backward()``) claims are on."""

    def __init__(self) -> None:
        self.depth = 0


capturing = _Capturing()


def claim_grad_destination(tensor: Tensor) -> GradDestination | None:
    """For an op's backward: the destination to write ``tensor``'s gradient into, or None.

    Non-None only when ``tensor`` is a leaf with a ``GradDestination``, its ``.grad`` is None
    and no ``autograd.grad()`` walk is running (``capturing``). The buffer becomes
    ``tensor.grad`` at once (so a second claim in this backward gets None). The op MUST write
    the gradient with ``dest.write(...)`` and return ``dest.buffer`` as that input's gradient;
    the walk then finds it in place (``write_leaf_grad`` does both).
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


def write_leaf_grad(leaf: Tensor, compute: Callable[..., Any], *operands: Any) -> Any:
    """For an op's backward that computes ``leaf``'s whole gradient in one go.

    ``compute(*operands, out=None)`` returns the gradient: written into ``out`` (returning
    ``out``), or as a fresh array. The leaf's reserved buffer is claimed when it can be
    (``claim_grad_destination``) and the gradient written there; otherwise the fresh array
    becomes ``.grad`` when it may (``adopt_grad``). Either way the op returns the result as
    the leaf's gradient: ``gw = write_leaf_grad(weight, mm, g2.T, x2)``.
    """
    dest = claim_grad_destination(leaf)
    if dest is None:
        return adopt_grad(leaf, compute(*operands))
    return dest.write(compute, *operands)


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
    ``g`` (``_install``), else a copy of ``g`` the leaf owns (an op may keep ``g``)."""
    dest = leaf._grad_dest
    if dest is None:
        leaf._grad = g.astype(leaf.array.dtype, copy=True)
        return
    dest.store(g)
    _install(leaf, dest)


__all__ = ["GradDestination", "adopt_grad", "capturing", "claim_grad_destination",
           "store_first", "write_leaf_grad"]
