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

Values are plain arrays and numbers (a torch-style optimizer's Tensors too: see
``minidist/optim/param_state.py``), so a checkpoint stores them without pickle.

The optimizers here write their update once, for ONE element, as scalar Python (an *element
function*, e.g. ``sgd_momentum_element`` in ``sgd.py``), registered as a ``FusedStep``
(``minidist.optim.registry``) that the class names in ``fused_kernel(group)``. ``step`` runs
it on whole arrays, in place (``_update``), or with ``fused=True`` as compiled loops built
from it (``minidist.optim.fused``). docs/layout.md, "A new optimizer with a fused kernel",
has a whole one.

Writing an optimizer torch's way (override ``step``, keep Tensors in ``self.state[p]``) works
as in torch: ``minidist/optim/param_state.py`` has a whole one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from minidist import xp as backend
from minidist.logger import get_logger, rank_prefix
from minidist.optim import fused, inplace
from minidist.optim.options import run_closure
from minidist.optim.param_state import ParamState, copy_value, load_value
from minidist.optim.registry import FusedStep

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
        self._plans: dict[FusedStep, inplace.Plan] = {}  # entry -> its last plan (_update)
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
        grad mode on, and its loss is returned. A torch-style optimizer overrides ``step``; the
        ones here name an element function (``fused_kernel``), which ``_update`` runs, one
        parameter at a time; groups with ``fused=True`` (or ``foreach=True``) go to
        ``minidist.optim.fused.step``.
        """
        loss = None if closure is None else run_closure(closure)
        if any(g.get("fused") or g.get("foreach") for g in self.param_groups):
            fused.step(self, self._update)
            return loss
        i = 0                                        # the parameter's index in state_dict
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._update(i, p, group)
                i += 1
        return loss

    def fused_kernel(self, group: dict[str, Any]) -> FusedStep | None:
        """The ``minidist.optim.registry`` entry, the element function and its scalars, that
        updates ``group``; None: no entry (the subclass overrides ``step``)."""
        return None

    def _update(self, i: int, p: Any, group: dict[str, Any]) -> None:
        """Update parameter ``i`` (its flat index) of ``group`` in place: its entry's element
        function on the whole arrays. The element was traced once, for steps of this kind,
        into ufunc calls with ``out=`` (``minidist.optim.inplace``); for SGD with momentum::

            buf *= momentum;  buf += g;  tmp = buf * lr;  p -= tmp

        The results go into the parameter, its state and a work buffer (``scratch``), so a
        step allocates nothing, and the bits are the fused kernels'.
        """
        entry = self.fused_kernel(group)
        if entry is None:
            raise NotImplementedError(f"{type(self).__name__} must override step(), _update() "
                                      "or fused_kernel().")
        state = self.state[i] if entry.state or entry.counts_steps else {}  # SGD: none
        first = not state
        t = state.get("step", 0) + 1 if entry.counts_steps else 0   # torch's "step" count
        scalars = entry.scalars(group, t, first)
        plan = self._plans.get(entry)                # the entry's last plan, while it fits
        if plan is None or plan.scalars != scalars or type(p.array) is not plan.array_type:
            plan = self._plans[entry] = inplace.plan_for(entry, scalars, p.array)
        if first:                                    # the state arrays start as zeros
            xp = backend.get_array_module(p.array)
            state.update({name: xp.zeros_like(p.array) for name in entry.state})
        if entry.counts_steps:
            state["step"] = t
        plan.run(p.array, p.grad.array, state, self.scratch, i, scalars)

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
                state[i] = {k: copy_value(v) for k, v in s.items()}
        return {"state": state, "param_groups": groups}

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
                k: load_value(self, name, sid, k, v, p, live.get(k))
                for k, v in s.items()}
        for saved, group in zip(saved_groups, self.param_groups):
            for k, v in saved.items():
                if k != "params":
                    group[k] = tuple(v) if isinstance(v, list) else v
        self.state = ParamState(self, new_state)

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, g in enumerate(self.param_groups):
            opts = ", ".join(f"{k}={v}" for k, v in g.items() if k != "params")
            lines.append(f"  group {i}: {len(g['params'])} params, {opts}")
        return "\n".join(lines + [")"])
