"""``Module`` and ``Parameter``: the containers layers are built from, with torch's conventions.

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(784, 1024)     # registered by __setattr__, in this order
            self.fc2 = nn.Linear(1024, 10)
        def forward(self, x):
            return self.fc2(self.fc1(x).relu())

    [name for name, _ in MLP().named_parameters()]  # ['fc1.weight', 'fc1.bias', 'fc2.weight', ...]

Names, order and ``state_dict`` keys match torch's for the same structure, so checkpoints and
DDP's bucket plan (reverse ``parameters()`` order) line up. ``load_state_dict`` copies INTO the
existing arrays, so views held by DDP buckets or optimizers stay valid.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Iterator, NamedTuple

import numpy

from minidist import xp as backend
from minidist.tensor import Tensor
from minidist.nn.module_devices import DeviceMethods
from minidist.tensor.core import error


def as_input(value: Any) -> Any:
    """A NumPy or CuPy array as a Tensor (outside the tape); anything else unchanged."""
    if isinstance(value, numpy.ndarray) or backend.is_device_array(value):
        return Tensor(value)
    return value


class Parameter(Tensor):
    """A Tensor that a Module registers as a learnable parameter (``requires_grad=True``)."""

    __slots__ = ()

    def __init__(self, data: Any, requires_grad: bool = True) -> None:
        super().__init__(data, requires_grad=requires_grad)

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()


class StateDictError(RuntimeError, ValueError):
    """``load_state_dict`` got missing/unexpected keys or wrongly shaped values."""


class IncompatibleKeys(NamedTuple):
    """What ``load_state_dict(strict=False)`` skipped."""

    missing_keys: list[str]
    unexpected_keys: list[str]


class Module(DeviceMethods):
    """Base class of every layer and model: registers parameters, buffers and sub-modules.

    Moving and casting (``to``, ``cpu``, ``cuda``, ``float``, ``half``, ``double``) are torch's
    surface, inherited from ``DeviceMethods`` (``minidist/nn/module_devices.py``)."""

    training: bool  # set by __init__ and train()/eval()
    _parameters: OrderedDict[str, Parameter | None]  # the registries, in registration order
    _buffers: OrderedDict[str, Tensor | None]
    _modules: OrderedDict[str, Module]

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

    # ---- registration --------------------------------------------------------------------

    def __setattr__(self, name: str, value: Any) -> None:
        if "_parameters" not in self.__dict__:
            if isinstance(value, (Parameter, Module)):
                raise AttributeError(error("Module", f"cannot assign {name!r} before "
                                           "Module.__init__(); call super().__init__() first."))
            object.__setattr__(self, name, value)
            return
        params, modules, buffers = self._parameters, self._modules, self._buffers
        if isinstance(value, Parameter):
            modules.pop(name, None)
            params[name] = value
        elif isinstance(value, Module):
            params.pop(name, None)
            modules[name] = value
        elif name in params:
            if value is not None:
                raise TypeError(error("Module", f"cannot assign a {type(value).__name__} to "
                                      f"parameter {name!r}; wrap it in nn.Parameter(...)."))
            params[name] = None
        elif name in buffers:
            buffers[name] = value if value is None or isinstance(value, Tensor) else Tensor(value)
            value = buffers[name]
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        for registry in (self._parameters, self._modules, self._buffers):
            registry.pop(name, None)
        object.__delattr__(self, name)

    def register_buffer(self, name: str, value: Any) -> None:
        """Register non-learnable state (e.g. running statistics) that goes in ``state_dict``."""
        self._buffers[name] = value if value is None or isinstance(value, Tensor) else \
            Tensor(value)
        object.__setattr__(self, name, self._buffers[name])

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        """Register ``param`` under ``name`` (same as ``self.name = param``)."""
        self._parameters[name] = param
        object.__setattr__(self, name, param)

    # ---- traversal -----------------------------------------------------------------------

    def named_children(self) -> Iterator[tuple[str, Module]]:
        yield from self._modules.items()

    def children(self) -> Iterator[Module]:
        for _, m in self.named_children():
            yield m

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        """This module (name ``prefix``) and all sub-modules, depth first."""
        yield prefix, self
        for name, child in self._modules.items():
            yield from child.named_modules(f"{prefix}.{name}" if prefix else name)

    def modules(self) -> Iterator[Module]:
        for _, m in self.named_modules():
            yield m

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, Parameter]]:
        """``("fc1.weight", p)`` pairs: own parameters first, then each child's, each once."""
        seen: set[int] = set()
        for mod_name, mod in self.named_modules(prefix):
            for name, p in mod._parameters.items():
                if p is not None and id(p) not in seen:
                    seen.add(id(p))
                    yield (f"{mod_name}.{name}" if mod_name else name), p

    def parameters(self) -> Iterator[Parameter]:
        for _, p in self.named_parameters():
            yield p

    def named_buffers(self, prefix: str = "") -> Iterator[tuple[str, Tensor]]:
        for mod_name, mod in self.named_modules(prefix):
            for name, b in mod._buffers.items():
                if b is not None:
                    yield (f"{mod_name}.{name}" if mod_name else name), b

    def num_parameters(self) -> int:
        """Total number of parameter elements."""
        return sum(p.size for p in self.parameters())

    def apply(self, fn: Any) -> Module:
        """Call ``fn(m)`` on every sub-module (children first) and then on self; returns self.

        torch's idiom for custom init: ``model.apply(init_weights)``.
        """
        for child in self.children():
            child.apply(fn)
        fn(self)
        return self

    # ---- modes and grads -----------------------------------------------------------------

    def train(self, mode: bool = True) -> Module:
        """Training mode (dropout active) for this module and all sub-modules; returns self."""
        for m in self.modules():
            object.__setattr__(m, "training", bool(mode))
        return self

    def eval(self) -> Module:
        """Evaluation mode (``train(False)``); returns self."""
        return self.train(False)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget gradients: set ``.grad`` to None, or zero the arrays IN PLACE (keeps views)."""
        for p in self.parameters():
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.array[...] = 0

    # ---- state ---------------------------------------------------------------------------

    def state_dict(self) -> OrderedDict[str, Any]:
        """Name -> copy of each parameter's and buffer's array (torch's keys and order)."""
        out: OrderedDict[str, Any] = OrderedDict()
        for mod_name, mod in self.named_modules():
            pre = f"{mod_name}." if mod_name else ""
            for registry in (mod._parameters, mod._buffers):
                for name, t in registry.items():
                    if t is not None:
                        out[pre + name] = t.array.copy()
        return out

    def load_state_dict(self, state_dict: dict[str, Any], strict: bool = True) -> IncompatibleKeys:
        """Copy values INTO the existing parameter/buffer arrays (in place, cast to their dtype).

        Args:
            state_dict: name -> array (NumPy, CuPy or Tensor), e.g. from ``state_dict()``.
            strict: raise on missing or unexpected keys (shape mismatches always raise).

        Returns:
            ``IncompatibleKeys(missing_keys, unexpected_keys)``.

        Raises:
            StateDictError: (a RuntimeError and ValueError) listing every problem at once.
        """
        own: OrderedDict[str, Tensor] = OrderedDict()
        for mod_name, mod in self.named_modules():
            pre = f"{mod_name}." if mod_name else ""
            for registry in (mod._parameters, mod._buffers):
                own.update((pre + n, t) for n, t in registry.items() if t is not None)
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        problems = []
        if strict and missing:
            problems.append("Missing key(s) in state_dict: " + ", ".join(f'"{k}"' for k in missing))
        if strict and unexpected:
            problems.append("Unexpected key(s) in state_dict: "
                            + ", ".join(f'"{k}"' for k in unexpected))
        for key, t in own.items():
            if key in state_dict:
                shape = tuple(getattr(state_dict[key], "shape", ()))
                if shape != t.shape:
                    problems.append(f"size mismatch for {key}: copying a param with shape {shape} "
                                    f"from checkpoint, the shape in current model is {t.shape}.")
        if problems and unexpected and all(k.startswith("module.") for k in unexpected):
            problems.append("The checkpoint's keys start with \"module.\": it holds a "
                            "DistributedDataParallel's state dict. Load it into the DDP "
                            "wrapper, or strip the prefix first with nn.modules.utils."
                            "consume_prefix_in_state_dict_if_present(state_dict, \"module.\")"
                            " (or save ddp.module.state_dict()).")
        if problems:
            raise StateDictError(error(
                "load_state_dict", f"Error(s) in loading state_dict for {type(self).__name__}:\n\t"
                + "\n\t".join(problems) + "\nCheck that the checkpoint was saved from the same "
                "model definition (or pass strict=False to skip missing/unexpected keys)."))
        for key, t in own.items():
            if key in state_dict:
                value = state_dict[key]
                value = value.array if isinstance(value, Tensor) else value
                xp = backend.get_array_module(t.array)
                t.array[...] = xp.asarray(value).astype(t.array.dtype, copy=False)
        return IncompatibleKeys(missing, unexpected)

    # ---- calling ---------------------------------------------------------------------------

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define forward().")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """``forward(*args, **kwargs)``; NumPy/CuPy array arguments are wrapped as Tensors
        (so ``model(x)`` works on the arrays a DataLoader yields)."""
        args = tuple(as_input(a) for a in args)
        kwargs = {k: as_input(v) for k, v in kwargs.items()}
        return self.forward(*args, **kwargs)

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        lines = [f"({name}): " + repr(m).replace("\n", "\n  ") for name, m in self._modules.items()]
        head = f"{type(self).__name__}({self.extra_repr()}"
        return head + (")" if not lines else "\n  " + "\n  ".join(lines) + "\n)")
