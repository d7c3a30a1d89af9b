"""GradDestination: a buffer reserved for a leaf's gradient (autograd.py writes into it).

DDP reserves each parameter's slot of a flat bucket this way, so backward writes every
gradient where the all-reduce reads it, with no copy (autograd.py's module docstring).
"""

from __future__ import annotations

from typing import Any

from minidist.tensor.core import error


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
    fills the same buffer again. DDP reserves each parameter's slot of its bucket, with
    ``scale = 1/n`` for a synced step (the average folded into the write: no separate pass).

    Args:
        buffer: a writable, C-contiguous float array of the leaf's shape (its dtype may differ
            from the leaf's: the write casts).
        scale: every gradient contribution is multiplied by it (1.0: stored as computed).

    Example::

        >>> import numpy as np
        >>> from minidist.tensor import GradDestination, Tensor
        >>> w = Tensor(np.ones((2, 3), np.float32), requires_grad=True)
        >>> flat = np.zeros(6, np.float32)              # e.g. one slot of a larger buffer
        >>> w.grad_destination = GradDestination(flat.reshape(2, 3), scale=0.5)
        >>> (w * 4.0).sum().backward()
        >>> bool(np.shares_memory(w.grad, flat)), flat.tolist()
        (True, [2.0, 2.0, 2.0, 2.0, 2.0, 2.0])
    """

    __slots__ = ("buffer", "scale")

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

    def __repr__(self) -> str:
        return (f"GradDestination(shape={tuple(self.buffer.shape)}, dtype={self.buffer.dtype}, "
                f"scale={self.scale})")


__all__ = ["GradDestination"]
