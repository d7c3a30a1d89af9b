"""The optimizer's per-parameter state: ``ParamState`` (``Optimizer.state``), and how a state
value is copied out by ``state_dict`` and loaded back by ``load_state_dict``.

Values are plain arrays and numbers, so a checkpoint stores them without pickle. A torch-style
optimizer that keeps Tensors (``state["mu"] = torch.zeros_like(p)``) gets copies of them in
``state_dict()``, and ``load_state_dict`` gives it Tensors back, from Tensors or arrays (a
file stores arrays), so its next ``mu.mul_(...)`` works.

Writing an optimizer (torch's way): subclass, pass the defaults up, override ``step`` and walk
``self.param_groups``; ``self.state[p]`` is the parameter's state dict (empty at first), and
``state_dict``/``load_state_dict`` then work as they are. ``p`` and ``p.grad`` are Tensors,
updated with torch's in-place methods under ``no_grad`` (the optimizers here work on
``p.array`` and ``p.grad.array``, the arrays, which is the same memory)::

    import numpy as np
    import minidist
    from minidist import nn, optim

    class SignSGD(optim.Optimizer):
        def __init__(self, params, lr=0.01, momentum=0.9):
            super().__init__(params, dict(lr=lr, momentum=momentum))

        @minidist.no_grad()
        def step(self, closure=None):
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    state = self.state[p]
                    if "momentum_buffer" not in state:
                        state["momentum_buffer"] = minidist.zeros_like(p)
                    buf = state["momentum_buffer"]
                    buf.mul_(group["momentum"]).add_(p.grad)
                    p.add_(buf.sign(), alpha=-group["lr"])

    model = nn.Linear(3, 1)
    opt = SignSGD(model.parameters())
    model(np.ones((2, 3), np.float32)).sum().backward()
    opt.step()
    assert list(opt.state_dict()["state"]) == [0, 1]
"""

from __future__ import annotations

from typing import Any

import numpy

from minidist import xp as backend
from minidist.tensor import Tensor


def copy_value(v: Any) -> Any:
    """A state value as ``state_dict`` returns it: arrays and Tensors copied, numbers as they are."""
    if isinstance(v, Tensor):
        return Tensor(v.array.copy())
    return v.copy() if hasattr(v, "shape") and getattr(v, "ndim", 0) > 0 else v


def keeps_tensors(opt: Any) -> bool:
    """True for a torch-style optimizer (its own ``step()``, no declared ``state_keys``):
    torch keeps such state as Tensors (``torch.zeros_like(p)``), so arrays loaded into it
    become Tensors; minidist's own optimizers keep arrays (their kernels read arrays)."""
    from minidist.optim.optimizer import Optimizer

    return opt.state_keys is None and type(opt).step is not Optimizer.step


def load_value(opt: Any, name: str, sid: int, key: str, value: Any, p: Any, live: Any) -> Any:
    """State ``key`` of saved parameter ``sid`` as ``opt`` keeps it for ``p``: on its device
    and in its dtype, a Tensor if it is one, the live state (``live``) holds one under that
    key, or (no live value) the optimizer keeps Tensors (``keeps_tensors``).

    Raises:
        ValueError: an array whose shape is not the parameter's.
    """
    as_tensor = isinstance(value, Tensor) or isinstance(live, Tensor) or (
        live is None and keeps_tensors(opt))
    if isinstance(value, Tensor):
        value = value.array
    is_array = hasattr(value, "shape") and not isinstance(value, numpy.generic)
    if as_tensor and is_array:  # torch's rule: floating state takes the parameter's dtype
        xp = backend.get_array_module(p.array)
        arr = xp.array(xp.asarray(value), copy=True)
        if arr.dtype.kind == "f" and p.array.dtype.kind == "f" and key != "step":
            arr = arr.astype(p.array.dtype)
        return Tensor(arr)
    if key == "step":
        return int(value)
    if not hasattr(value, "shape") or getattr(value, "ndim", 0) == 0:
        return value.item() if hasattr(value, "item") else value  # a number (a custom key)
    shape = tuple(getattr(value, "shape", ()))
    if shape != tuple(p.array.shape):
        raise ValueError(f"{name}: state {key!r} of parameter {sid} has shape {shape} but the "
                         f"parameter has shape {tuple(p.array.shape)}. The checkpoint belongs to "
                         "a different model.")
    xp = backend.get_array_module(p.array)
    return xp.array(xp.asarray(value), dtype=p.array.dtype, copy=True)


class ParamState(dict):
    """``Optimizer.state``: a dict by parameter index that also takes the parameter itself.

    ``state[p]`` and ``state[i]`` are the same entry (``i = optimizer.param_index(p)``), and a
    missing entry reads as a new empty dict (torch's ``defaultdict(dict)``), so a torch-style
    ``step()`` ports as it is; ``state_dict()`` numbers the entries by index, torch's layout.
    """

    def __init__(self, owner: Any, entries: dict[Any, dict[str, Any]] | None = None
                 ) -> None:
        super().__init__()
        self._owner = owner
        for key, value in (entries or {}).items():
            self[key] = value

    def _key(self, key: Any) -> int:
        if isinstance(key, (int, numpy.integer)):
            return int(key)
        return self._owner.param_index(key)

    def __missing__(self, key: Any) -> dict[str, Any]:
        # dict's own lookup found no entry under ``key``: an index or parameter seen for the
        # first time (a new empty entry), or a parameter whose entry sits under its index.
        # An index that exists is found by dict's C lookup and never comes here.
        k = self._key(key)
        if not super().__contains__(k):
            super().__setitem__(k, {})
        return super().__getitem__(k)

    def __setitem__(self, key: Any, value: dict[str, Any]) -> None:
        super().__setitem__(self._key(key), value)

    def __delitem__(self, key: Any) -> None:
        super().__delitem__(self._key(key))

    def __contains__(self, key: Any) -> bool:
        try:
            return super().__contains__(self._key(key))
        except KeyError:
            return False

    def get(self, key: Any, default: Any = None) -> Any:
        return super().get(self._key(key), default)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        return super().setdefault(self._key(key), default)

    def pop(self, key: Any, *default: Any) -> Any:
        return super().pop(self._key(key), *default)
