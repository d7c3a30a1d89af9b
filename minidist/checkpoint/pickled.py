"""Whole objects for ``save``/``load``: ``minidist.save(model, f)`` as ``torch.save(model)``.

    minidist.save(model, "model.pt")                       # a whole Module: pickled
    model = minidist.load("model.pt", weights_only=False)  # as torch 2.6+: opt in to unpickle

State trees (arrays, numbers, strings, lists, dicts) are stored as data (codec.py); a tree that
holds a ``Module`` cannot be, so it is pickled, as torch does, into the same npz container: a
``__meta__.json`` entry with ``"pickled": true`` and the pickle's bytes in ``__pickle__``.
Unpickling runs code named in the file, so ``load`` refuses such a file unless the caller says
``weights_only=False`` (torch 2.6+ defaults to ``weights_only=True`` for the same reason).

Tensors are pickled as their data, gradient and ``requires_grad``: the tape, hooks (DDP's
gradient hooks among them) and gradient destinations belong to the running process and are
left out, so ``model.module`` of a DistributedDataParallel saves as a plain model.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Mapping
from typing import Any

import numpy as np

from minidist import xp as backend
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


def rebuild_tensor(cls: type, data: Any, grad: Any, requires_grad: bool) -> Tensor:
    """Unpickle a Tensor or Parameter: its data, gradient and requires_grad, nothing else."""
    t = cls(data, requires_grad=requires_grad)
    if grad is not None:
        t.grad = grad
    return t


class TensorPickler(pickle.Pickler):
    """A Pickler that stores each Tensor as ``rebuild_tensor(cls, data, grad, requires_grad)``
    (arrays on the host), leaving out what only the running process can use."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, Tensor):
            grad = obj.grad
            return (rebuild_tensor, (type(obj), np.asarray(backend.to_host(obj.data)),
                                     None if grad is None else np.asarray(backend.to_host(grad)),
                                     obj.requires_grad))
        return NotImplemented


def dumps(obj: Any) -> np.ndarray:
    """``obj`` pickled, as a uint8 array for the npz container."""
    buf = io.BytesIO()
    TensorPickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return np.frombuffer(buf.getvalue(), dtype=np.uint8)


def loads(payload: np.ndarray, map_location: Any) -> Any:
    """Unpickle; with a CUDA ``map_location`` move every top-level Module or Tensor there."""
    obj = pickle.loads(payload.tobytes())
    if map_location is None or backend.device(map_location).type == "cpu":
        return obj
    return move_objects(obj, map_location)


def move_objects(obj: Any, where: Any) -> Any:
    if isinstance(obj, (Module, Tensor)):
        return obj.to(where)
    if isinstance(obj, dict):
        return {k: move_objects(v, where) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(move_objects(v, where) for v in obj)
    return obj


__all__ = ["PICKLE_KEY", "holds_module", "rebuild_tensor", "TensorPickler", "dumps", "loads"]
