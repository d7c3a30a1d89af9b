"""Whole objects for ``save``/``load``: ``minidist.save(model, f)`` as ``torch.save(model)``.

    minidist.save(model, "model.pt")                       # a whole Module: pickled
    model = minidist.load("model.pt", weights_only=False)  # as torch 2.6+: opt in to unpickle

State trees (arrays, numbers, strings, lists, dicts) are stored as data (codec.py); a tree that
holds a ``Module`` cannot be, so it is pickled, as torch does, into the same npz container: a
``__meta__.json`` entry with ``"pickled": true`` and the pickle's bytes in ``__pickle__``.
Unpickling runs code named in the file, so ``load`` refuses such a file unless the caller says
``weights_only=False`` (torch 2.6+ defaults to ``weights_only=True`` for the same reason).

Tensors are pickled as their data, gradient, ``requires_grad`` and the device they were on:
the tape, hooks (DDP's gradient hooks among them) and gradient destinations belong to the
running process and are left out, so ``model.module`` of a DistributedDataParallel saves as a
plain model. ``load`` puts each Tensor where ``map_location`` sends its saved device.

Any other object that is not data (a dataclass config, a function) is pickled the same way, as
torch does; with ``weights_only`` on, the unpickler rebuilds only the allow-listed classes
(safe_globals.py), so such a file loads with ``weights_only=False`` or an allow-list entry.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from minidist import xp as backend
from minidist.checkpoint.safe_globals import is_allowed
from minidist.logger import rank_prefix
from minidist.nn import Module
from minidist.tensor import Tensor

PICKLE_KEY = "__pickle__"  # the npz entry holding the pickle's bytes


def holds_module(obj: Any) -> bool:
    """True when the tree ``obj`` contains a Module (then it is saved by pickling)."""
    if isinstance(obj, Module):
        return True
    if isinstance(obj, Mapping):
        return any(holds_module(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return any(holds_module(v) for v in obj)
    return False


def rebuild_tensor(cls: type, data: Any, grad: Any, requires_grad: bool,
                   device: str = "cpu") -> Tensor:
    """Unpickle a Tensor or Parameter: its data, gradient and requires_grad, nothing else
    (``device``, where it was saved, is read by the unpickler of ``loads``)."""
    t = cls(data, requires_grad=requires_grad)
    if grad is not None:
        t.grad = grad
    return t


class TensorPickler(pickle.Pickler):
    """A Pickler that stores each Tensor as ``rebuild_tensor(cls, data, grad, requires_grad,
    device)`` (arrays on the host), leaving out what only the running process can use."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, Tensor):
            grad = None if obj.grad is None else obj.grad.array
            return (rebuild_tensor, (type(obj), np.asarray(backend.to_host(obj.array)),
                                     None if grad is None else np.asarray(backend.to_host(grad)),
                                     obj.requires_grad, str(obj.device)))
        return NotImplemented


def dumps(obj: Any) -> np.ndarray:
    """``obj`` pickled, as a uint8 array for the npz container."""
    buf = io.BytesIO()
    try:
        TensorPickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    except (pickle.PicklingError, AttributeError, TypeError) as e:
        raise TypeError(f"save: cannot pickle what the tree holds ({type(e).__name__}: {e}). "
                        "Store data (arrays, numbers, strings, lists, dicts), module-level "
                        "classes and functions, or convert objects with their state_dict()."
                        ) from e
    return np.frombuffer(buf.getvalue(), dtype=np.uint8)


class _Unpickler(pickle.Unpickler):
    """Rebuilds each Tensor on the device ``place(saved device)`` names; with ``weights_only``
    only the allow-listed globals (safe_globals.py) are rebuilt."""

    def __init__(self, file: Any, place: Callable[[str], Any], weights_only: bool,
                 name: str) -> None:
        super().__init__(file)
        self.place, self.weights_only, self.name = place, weights_only, name

    def find_class(self, module: str, name: str) -> Any:
        if module == __name__ and name == "rebuild_tensor":
            return self.rebuild
        obj = super().find_class(module, name)
        if self.weights_only and not is_allowed(module, name, obj):
            raise pickle.UnpicklingError(
                f"{rank_prefix()} load: weights_only load of {self.name} refused the global "
                f"{module}.{name}: unpickling it runs code the file names. If you trust the "
                "file, pass weights_only=False, or allow this global: minidist.serialization."
                f"add_safe_globals([{name}]) or the minidist.serialization.safe_globals([{name}])"
                " context manager (torch.serialization's names).")
        return obj

    def rebuild(self, cls: type, data: Any, grad: Any, requires_grad: bool,
                device: str = "cpu") -> Tensor:
        target = self.place(device)
        if target is not None and backend.device(target).type != "cpu":
            try:
                data = backend.move(data, target)
                grad = None if grad is None else backend.move(grad, target)
            except backend.DeviceUnavailableError as e:
                raise backend.DeviceUnavailableError(
                    f"{rank_prefix()} load: map_location sends a tensor saved on {device} to "
                    f"{target}, and this machine cannot use it ({e}). To load the file here, "
                    f"pass map_location='cpu' (or a dict that maps {device!r} to 'cpu')."
                    ) from e
        return rebuild_tensor(cls, data, grad, requires_grad)


def loads(payload: np.ndarray, place: Callable[[str], Any], weights_only: bool = False,
          name: str = "<file>") -> Any:
    """Unpickle; each Tensor goes to ``place(the device it was saved from)`` (None: the host)."""
    return _Unpickler(io.BytesIO(payload.tobytes()), place, weights_only, name).load()


__all__ = ["PICKLE_KEY", "holds_module", "rebuild_tensor", "TensorPickler", "dumps", "loads"]
