"""torch's module containers: ModuleList and ModuleDict (``Sequential``, which also runs its
children in order, is in ``minidist/nn/layers.py``).

    blocks = nn.ModuleList([Block(d) for _ in range(n_layer)])   # children "0", "1", ...
    heads = nn.ModuleDict({"cls": nn.Linear(d, 10)})            # children under their keys

They register their modules as children (``parameters``, ``state_dict`` and ``to`` see them)
and have no forward of their own. Also importable from ``nn.layers``, from ``nn`` and from
torch's ``nn.modules.container`` path.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Mapping

from minidist.nn.module import Module
from minidist.tensor.core import error


class ModuleList(Module):
    """A list of modules, registered as children "0", "1", ... (no forward of its own)."""

    def __init__(self, modules: Iterable[Module] | None = None) -> None:
        super().__init__()
        for m in modules or ():
            self.append(m)

    def append(self, module: Module) -> ModuleList:
        if not isinstance(module, Module):
            raise TypeError(error("ModuleList", f"can only hold Modules, got "
                                  f"{type(module).__name__}."))
        setattr(self, str(len(self._modules)), module)
        return self

    def extend(self, modules: Iterable[Module]) -> ModuleList:
        for m in modules:
            self.append(m)
        return self

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def __getitem__(self, index: int | slice) -> Any:
        layers = list(self._modules.values())
        if isinstance(index, slice):
            return ModuleList(layers[index])
        if not -len(layers) <= index < len(layers):
            raise IndexError(error("ModuleList", f"index {index} is out of range for "
                                   f"{len(layers)} modules."))
        return layers[index]


class ModuleDict(Module):
    """A dict of modules, registered as children under their keys (insertion order)."""

    def __init__(self, modules: Mapping[str, Module] | None = None) -> None:
        super().__init__()
        for name, m in (modules or {}).items():
            self[name] = m

    def __setitem__(self, name: str, module: Module) -> None:
        if not isinstance(module, Module):
            raise TypeError(error("ModuleDict", f"value for {name!r} is a "
                                  f"{type(module).__name__}, not a Module."))
        setattr(self, name, module)

    def __getitem__(self, name: str) -> Module:
        return self._modules[name]

    def __contains__(self, name: object) -> bool:
        return name in self._modules

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[str]:
        return iter(self._modules)

    def keys(self) -> Any:
        return self._modules.keys()

    def values(self) -> Any:
        return self._modules.values()

    def items(self) -> Any:
        return self._modules.items()
