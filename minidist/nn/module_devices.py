"""torch's device and dtype methods of a Module: ``to``, ``cpu``, ``cuda``, ``float``, ``half``,
``double``. Every one moves or casts the parameters and buffers IN PLACE and returns the module.

``Module`` (``minidist/nn/module.py``) inherits them from ``DeviceMethods``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy

from minidist import xp as backend
from minidist.tensor.conversion import parse_to_args
from minidist.tensor.core import is_floating

if TYPE_CHECKING:
    from minidist.nn.module import Module


class DeviceMethods:
    """The device and dtype methods ``Module`` inherits (torch's)."""

    def to(self: Any, *args: Any, **kwargs: Any) -> Module:
        """Move and/or cast every parameter and buffer IN PLACE; returns self (torch's ``to``).

            model.to("cuda:0"); model.to(numpy.float64); model.to(device, dtype); model.to(t)

        The Parameter objects stay the same objects (only their ``.array``, and ``.grad`` if set,
        are replaced), so an optimizer built before ``.to()`` still updates them. As in torch, a
        dtype applies to floating-point parameters and buffers only (integer buffers keep theirs).
        Call it before wrapping the model in DistributedDataParallel, whose buckets hold views
        of the gradients.

        Raises:
            DeviceUnavailableError: a CUDA device was asked for on a machine without one.
        """
        where, dtype = parse_to_args("Module.to", args, kwargs)
        return self._apply_to_tensors(where, dtype)

    def _apply_to_tensors(self: Any, where: Any, dtype: Any) -> Module:
        def convert(array: Any) -> Any:
            if where is not None:
                array = backend.move(array, where)
            if dtype is not None and is_floating(array.dtype):
                array = array.astype(dtype, copy=False)
            return array

        for t in [*self.parameters(), *(buffer for _, buffer in self.named_buffers())]:
            t.array = convert(t.array)
            if t.grad is not None:
                t.grad = convert(t.grad.array)
        return self

    def cpu(self: Any) -> Module:
        """Move every parameter and buffer to the CPU, in place; returns self."""
        return self._apply_to_tensors(backend.device("cpu"), None)

    def cuda(self: Any, device: Any = None) -> Module:
        """Move every parameter and buffer to GPU ``device`` (default: current), in place."""
        return self._apply_to_tensors(backend.device("cuda", device) if isinstance(
            device, (int, type(None))) else backend.device(device), None)

    def float(self: Any) -> Module:
        """Cast floating-point parameters and buffers to float32, in place; returns self."""
        return self._apply_to_tensors(None, numpy.dtype(numpy.float32))

    def half(self: Any) -> Module:
        """Cast floating-point parameters and buffers to float16, in place; returns self."""
        return self._apply_to_tensors(None, numpy.dtype(numpy.float16))

    def double(self: Any) -> Module:
        """Cast floating-point parameters and buffers to float64, in place; returns self."""
        return self._apply_to_tensors(None, numpy.dtype(numpy.float64))
