"""The Tensor methods that write into the tensor's own memory: ``add_``, ``t += x``, ``zero_``.

    >>> from minidist.tensor import Tensor
    >>> p = Tensor([1.0, 2.0])
    >>> p.mul_(2).add_(Tensor([0.5, 0.5]), alpha=2).tolist()      # SGD-style, in p's array
    [3.0, 5.0]
    >>> p.zero_().tolist()
    [0.0, 0.0]

Two kinds, as in torch:

- in-place arithmetic (``add_ sub_ mul_ div_ pow_ clamp_ addcmul_ addcdiv_`` and the augmented
  assignments ``+= -= *= /=``) follows torch's autograd rules for in-place ops, which
  ``inplace.py`` implements: into the tensor's array when the tape is not involved, recorded
  on the tape otherwise, refused on a leaf that requires grad while grad mode is on;
- initialisers (``zero_ fill_ normal_ uniform_ copy_``) always write outside the tape, like
  ``nn.init``: ``p.data.normal_(0, 0.02)``.

As in ``methods``, each is a plain function whose first parameter is the tensor, using only
its public surface; ``METHODS`` at the bottom is attached to ``Tensor`` by ``core.py``.
"""

from __future__ import annotations

from typing import Any

import numpy

from minidist import xp as backend
from minidist.tensor import inplace, random
from minidist.tensor.core import Tensor

# ---- in-place arithmetic (inplace.py: torch's autograd rules for in-place ops) ---------------


def add_(self: Tensor, other: Any, *, alpha: Any = 1) -> Tensor:
    return inplace.add_(self, other, alpha)


def sub_(self: Tensor, other: Any, *, alpha: Any = 1) -> Tensor:
    return inplace.sub_(self, other, alpha)


def mul_(self: Tensor, other: Any) -> Tensor:
    return inplace.mul_(self, other)


def div_(self: Tensor, other: Any) -> Tensor:
    return inplace.div_(self, other)


def pow_(self: Tensor, exponent: Any) -> Tensor:
    return inplace.pow_(self, exponent)


def clamp_(self: Tensor, min: Any = None, max: Any = None) -> Tensor:  # noqa: A002
    return inplace.clamp_(self, min, max)


def addcmul_(self: Tensor, tensor1: Any, tensor2: Any, *, value: Any = 1) -> Tensor:
    return inplace.addcmul_(self, tensor1, tensor2, value)


def addcdiv_(self: Tensor, tensor1: Any, tensor2: Any, *, value: Any = 1) -> Tensor:
    return inplace.addcdiv_(self, tensor1, tensor2, value)


# ``t += x``: in place outside the tape (``p.data -= lr * g`` updates p's own memory, as in
# torch); on the tape the result is a new tensor, as ``t = t + x`` (see inplace.augmented)

def iadd(self: Tensor, other: Any) -> Tensor:
    return inplace.augmented(self, "add_", other)


def isub(self: Tensor, other: Any) -> Tensor:
    return inplace.augmented(self, "sub_", other)


def imul(self: Tensor, other: Any) -> Tensor:
    return inplace.augmented(self, "mul_", other)


def itruediv(self: Tensor, other: Any) -> Tensor:
    return inplace.augmented(self, "div_", other)


# ---- in-place fills, torch's initialisers (outside the tape, like nn.init) --------------------

def zero_(self: Tensor) -> Tensor:
    self.array[...] = 0
    return self


def fill_(self: Tensor, value: Any) -> Tensor:
    self.array[...] = value.item() if isinstance(value, Tensor) else value
    return self


def normal_(self: Tensor, mean: float = 0.0, std: float = 1.0) -> Tensor:
    """Fill with N(mean, std^2) draws from the ``manual_seed`` generator; returns self."""
    host = random.default_generator().normal(mean, std, size=self.shape)
    return fill_from_host(self, host)


def uniform_(self: Tensor, a: float = 0.0, b: float = 1.0) -> Tensor:
    """Fill with U(a, b) draws from the ``manual_seed`` generator; returns self."""
    return fill_from_host(self, random.default_generator().uniform(a, b, size=self.shape))


def copy_(self: Tensor, src: Any) -> Tensor:
    """Copy ``src``'s values into this tensor's array (cast, broadcast); returns self."""
    value = src.array if isinstance(src, Tensor) else src
    xp = backend.get_array_module(self.array)
    self.array[...] = xp.asarray(backend.move(value, self.device)).astype(self.array.dtype)
    return self


def fill_from_host(t: Tensor, host: numpy.ndarray) -> Tensor:
    """Write the host array ``host`` (float64 draws) into ``t``'s array, in ``t``'s dtype."""
    xp = backend.get_array_module(t.array)
    t.array[...] = xp.asarray(host.astype(t.array.dtype))
    return t


# The method name -> the function; core.py attaches these to Tensor.
METHODS: dict[str, Any] = {
    "add_": add_, "sub_": sub_, "mul_": mul_, "div_": div_, "pow_": pow_, "clamp_": clamp_,
    "addcmul_": addcmul_, "addcdiv_": addcdiv_,
    "__iadd__": iadd, "__isub__": isub, "__imul__": imul, "__itruediv__": itruediv,
    "zero_": zero_, "fill_": fill_, "normal_": normal_, "uniform_": uniform_, "copy_": copy_,
}
