"""The optimizer base class: parameter groups, per-parameter state, zero_grad, state_dict.

    opt = SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt = SGD([{"params": body.parameters()}, {"params": head.parameters(), "lr": 0.01}], lr=0.1)
    opt.param_groups[1]["lr"] = 0.005          # schedules write here, as in torch

A parameter is a Tensor: its ``.array`` (the xp array) is updated IN PLACE, never rebound (DDP
and the model keep views of it), and its ``.grad`` is a Tensor or None (None means "no gradient
this step", and the parameter is skipped). Parameters are numbered 0, 1, 2, ... in group order; that
number is the key of the per-parameter state and of ``state_dict()``, exactly torch's layout::

    {"state": {0: {"momentum_buffer": arr}, 1: {...}},            # only params with state
     "param_groups": [{"lr": 0.1, "momentum": 0.9, ..., "params": [0, 1]},
                      {"lr": 0.01, ...,                "params": [2, 3]}]}

Values are plain arrays and numbers, so a checkpoint stores them without pickle. A torch-style
optimizer that keeps Tensors (``state["mu"] = torch.zeros_like(p)``) gets copies of them in
``state_dict()``, and ``load_state_dict`` gives it Tensors back, from Tensors or arrays (a
file stores arrays), so its next ``mu.mul_(...)`` works.

An optimizer with a fused kernel (``fused=True``) is written differently: its update is one
element function registered as a ``FusedStep`` (``minidist.optim.registry``), and the class
only names it in ``fused_kernel(group)``; ``step`` then runs the compiled loops built from it,
or (without ``_update`` of its own) the same function on whole arrays. docs/layout.md,
"A new optimizer with a fused kernel", has a whole one.

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

from collections.abc import Callable, Iterable
from typing import Any

import numpy

from minidist import xp as backend
from minidist.logger import get_logger, rank_prefix
from minidist.optim import fused
from minidist.optim.options import run_closure
from minidist.optim.registry import FusedStep
from minidist.tensor import Tensor

log = get_logger(__name__)

_required = object()  # a default that must be given (torch's `required` sentinel)


class Optimizer:
    """Base class: holds ``param_groups`` and ``state``; subclasses implement ``step()``.

    Args:
        params: parameters, or a list of dicts each with a ``"params"`` entry plus per-group
            hyper-parameters that override ``defaults``.
        defaults: the hyper-parameters of every group that does not set its own.

    Raises:
        ValueError: no parameters, a parameter in two groups, or a required option missing.
    """

    # The keys subclasses keep per parameter; load_state_dict checks them (None: any keys).
    state_keys: tuple[str, ...] | None = None

    def __init__(self, params: Iterable[Any], defaults: dict[str, Any]) -> None:
        self.defaults = dict(defaults)
        self.param_groups: list[dict[str, Any]] = []
        self._index_of: dict[int, int] | None = None  # id(param) -> its index (see ParamState)
        self.state = ParamState(self)  # param index -> its state (see __setattr__)
        self._scratch: dict[tuple[int, int], Any] = {}  # (param index, slot) -> work buffer
        params = list(params)
        if len(params) == 0:
            raise ValueError(f"{rank_prefix()} {type(self).__name__}: got an empty parameter list. "
                             "Pass model.parameters() of a model that has parameters.")
        if not isinstance(params[0], dict):
            params = [{"params": params}]
        for group in params:
            self.add_param_group(group)

    # ---------------------------------------------------------------- groups
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Append a group (a dict with ``"params"``); missing options come from ``defaults``."""
        name = type(self).__name__
        if not isinstance(param_group, dict) or "params" not in param_group:
            raise ValueError(f"{rank_prefix()} {name}.add_param_group: expected a dict with a "
                             f"'params' entry, got {type(param_group).__name__}.")
        group = dict(param_group)
        ps = group["params"]
        group["params"] = [ps] if hasattr(ps, "array") else list(ps)
        for key, value in self.defaults.items():
            if value is _required and key not in group:
                raise ValueError(f"{rank_prefix()} {name}: parameter group {len(self.param_groups)} "
                                 f"does not set the required option {key!r}. Pass {key}=... .")
            group.setdefault(key, value)
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        for p in group["params"]:
            if not hasattr(p, "array") or not hasattr(p, "grad"):
                raise ValueError(f"{rank_prefix()} {name}: a parameter must have .array and .grad, "
                                 f"got {type(p).__name__}. Pass model.parameters().")
            if id(p) in seen:
                raise ValueError(f"{rank_prefix()} {name}: a parameter of shape "
                                 f"{tuple(p.array.shape)} appears in more than one group (or twice). "
                                 "Each parameter may belong to one group only.")
            seen.add(id(p))
        self.param_groups.append(group)
        self._index_of = None
        log.debug("%s: group %d with %d parameters", name, len(self.param_groups) - 1,
                  len(group["params"]))

    def __setattr__(self, name: str, value: Any) -> None:
        """``self.state``, the per-parameter state, is always a ``ParamState``: a dict by index
        that takes the parameter itself too (``self.state[p]``, torch's way), where a missing
        entry reads as a new empty dict (torch's ``defaultdict(dict)``). Assigning a plain dict
        (``opt.state = {...}``) wraps it; reading is a plain attribute read, with no Python
        code in between (a step reads it per parameter)."""
        if name == "state" and not isinstance(value, ParamState):
            value = ParamState(self, value)
        super().__setattr__(name, value)

    def param_index(self, param: Any) -> int:
        """The index of ``param`` (its number in ``state_dict``), found by identity."""
        if self._index_of is None:
            self._index_of = {id(p): i for i, p, _ in self.indexed_params()}
        try:
            return self._index_of[id(param)]
        except KeyError:
            raise KeyError(f"{rank_prefix()} {type(self).__name__}: this parameter (shape "
                           f"{tuple(getattr(param.array, 'shape', ()))}) is not in any of its "
                           "param_groups.") from None

    def indexed_params(self) -> Iterable[tuple[int, Any, dict[str, Any]]]:
        """Yield ``(index, param, group)`` for every parameter, numbered as in ``state_dict``."""
        i = 0
        for group in self.param_groups:
            for p in group["params"]:
                yield i, p, group
                i += 1

    def scratch(self, index: int, like: Any, slot: int = 0) -> Any:
        """A reusable work buffer shaped like ``like`` (allocated once, so steps do not allocate)."""
        buf = self._scratch.get((index, slot))
        if buf is None or buf.shape != like.shape or buf.dtype != like.dtype:
            buf = backend.get_array_module(like).empty_like(like)
            self._scratch[(index, slot)] = buf
        return buf

    # ---------------------------------------------------------------- gradients
    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear every gradient: set it to None (default, as torch) or fill it with zeros in place.

        ``set_to_none=False`` keeps the gradient arrays (and any views into them, e.g. DDP
        buckets) alive and writes zeros into them.
        """
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.array[...] = 0

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One update of every parameter whose ``.grad`` is not None (skipped ones keep state).

        ``closure`` (torch's): re-evaluates the model and returns the loss; it runs first, with
        grad mode on, and its loss is returned. The public extension point is this method:
        a new optimizer overrides ``step`` and walks ``self.param_groups`` and
        ``self.state[p]`` as in torch (see the module docstring). The optimizers here
        implement ``_update(i, p, group)`` instead, one parameter at a time, and groups with
        ``fused=True`` (or ``foreach=True``) go to ``minidist.optim.fused.step``.
        """
        loss = None if closure is None else run_closure(closure)
        if any(g.get("fused") or g.get("foreach") for g in self.param_groups):
            fused.step(self, self._update)
            return loss
        for i, p, group in self.indexed_params():
            if p.grad is not None:
                self._update(i, p, group)
        return loss

    def fused_kernel(self, group: dict[str, Any]) -> FusedStep | None:
        """The ``minidist.optim.registry`` entry that updates ``group`` when it sets
        ``fused=True``, or None (no fused step: ``_update`` runs). Optimizers with a fused
        kernel override it."""
        return None

    def _update(self, i: int, p: Any, group: dict[str, Any]) -> None:
        """The update rule for parameter ``i`` (its flat index) of ``group``. By default the
        fused entry's element function on whole arrays (``fused.reference_update``); the
        optimizers here write their own, allocation-free."""
        entry = self.fused_kernel(group)
        if entry is None:
            raise NotImplementedError(f"{type(self).__name__} must override step(), _update() "
                                      "or fused_kernel().")
        fused.reference_update(self, entry, i, p, group)

    # ---------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The optimizer's state in torch's layout (arrays are copies; see the module docstring)."""
        groups, start = [], 0
        for group in self.param_groups:
            g = {k: v for k, v in group.items() if k != "params"}
            g["params"] = list(range(start, start + len(group["params"])))
            start += len(group["params"])
            groups.append(g)
        state = {}
        for i, s in self.state.items():
            if s:  # entries only read (``self.state[p]`` creates them) are not state
                state[i] = {k: _copy_value(v) for k, v in s.items()}
        return {"state": state, "param_groups": groups}

    def _keeps_tensors(self) -> bool:
        """True for a torch-style optimizer (its own ``step()``, no declared ``state_keys``):
        torch keeps such state as Tensors (``torch.zeros_like(p)``), so arrays loaded into it
        become Tensors; minidist's own optimizers keep arrays (their kernels read arrays)."""
        return self.state_keys is None and type(self).step is not Optimizer.step

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore state saved by ``state_dict()``; arrays are copied onto each parameter's device.

        Keys may be ints or digit strings (as JSON/npz round-trips give them back).

        Raises:
            ValueError: the group count, a group's parameter count, a state key or an array shape
                does not match this optimizer; the message names the group/parameter.
        """
        name = f"{rank_prefix()} {type(self).__name__}.load_state_dict"
        if "state" not in state_dict or "param_groups" not in state_dict:
            raise ValueError(f"{name}: expected keys 'state' and 'param_groups', got "
                             f"{sorted(state_dict)}. Pass the dict returned by state_dict().")
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(f"{name}: the checkpoint has {len(saved_groups)} parameter groups but "
                             f"this optimizer has {len(self.param_groups)}. Build the optimizer "
                             "with the same groups as the one that was saved.")
        for gi, (saved, group) in enumerate(zip(saved_groups, self.param_groups)):
            if len(saved["params"]) != len(group["params"]):
                raise ValueError(f"{name}: group {gi} has {len(saved['params'])} parameters in the "
                                 f"checkpoint but {len(group['params'])} here. Build the same "
                                 "model (same layers, same order) before loading.")
        # Map the saved param numbers onto this optimizer's parameters, group by group.
        by_saved = {}
        for saved, group in zip(saved_groups, self.param_groups):
            for sid, p in zip(saved["params"], group["params"]):
                by_saved[int(sid)] = p
        index_of = {id(p): i for i, p, _ in self.indexed_params()}
        new_state: dict[int, dict[str, Any]] = {}
        for key, s in state_dict["state"].items():
            sid = int(key)
            if sid not in by_saved:
                raise ValueError(f"{name}: the checkpoint has state for parameter {sid}, which is "
                                 f"not in any saved group (0..{len(by_saved) - 1}).")
            p = by_saved[sid]
            unknown = set(s) - set(self.state_keys) if self.state_keys is not None else set()
            if unknown:
                raise ValueError(f"{name}: parameter {sid} has unknown state keys {sorted(unknown)}; "
                                 f"{type(self).__name__} keeps {list(self.state_keys or ())}. "
                                 "Load a "
                                 f"checkpoint of the same optimizer type.")
            live = self.state.get(index_of[id(p)]) or {}
            new_state[index_of[id(p)]] = {
                k: self._load_value(name, sid, k, v, p, self._wants_tensor(v, live.get(k)))
                for k, v in s.items()}
        for saved, group in zip(saved_groups, self.param_groups):
            for k, v in saved.items():
                if k != "params":
                    group[k] = tuple(v) if isinstance(v, list) else v
        self.state = ParamState(self, new_state)

    def _wants_tensor(self, value: Any, live: Any) -> bool:
        """Whether a loaded state value becomes a Tensor: it is one, the live state holds one
        under that key, or (no live value) the optimizer keeps Tensors (``_keeps_tensors``)."""
        if isinstance(value, Tensor) or isinstance(live, Tensor):
            return True
        return live is None and self._keeps_tensors()

    @staticmethod
    def _load_value(name: str, sid: int, key: str, value: Any, p: Any,
                    as_tensor: bool = False) -> Any:
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

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, g in enumerate(self.param_groups):
            opts = ", ".join(f"{k}={v}" for k, v in g.items() if k != "params")
            lines.append(f"  group {i}: {len(g['params'])} params, {opts}")
        return "\n".join(lines + [")"])


def _copy_value(v: Any) -> Any:
    """A state value as ``state_dict`` returns it: arrays and Tensors copied, numbers as they are."""
    if isinstance(v, Tensor):
        return Tensor(v.array.copy())
    return v.copy() if hasattr(v, "shape") and getattr(v, "ndim", 0) > 0 else v


class ParamState(dict):
    """``Optimizer.state``: a dict by parameter index that also takes the parameter itself.

    ``state[p]`` and ``state[i]`` are the same entry (``i = optimizer.param_index(p)``), and a
    missing entry reads as a new empty dict (torch's ``defaultdict(dict)``), so a torch-style
    ``step()`` ports as it is; ``state_dict()`` numbers the entries by index, torch's layout.
    """

    def __init__(self, owner: Optimizer, entries: dict[Any, dict[str, Any]] | None = None
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
