"""The torch.nn.Module methods DistributedDataParallel passes to the module it wraps.

Names carry torch's ``module.`` prefix, as torch's DDP (whose wrapped model is its child named
``module``): ``ddp.state_dict()`` has ``module.fc.weight``, ``ddp.named_parameters()`` yields
``("module.fc.weight", p)``, and ``ddp.module.state_dict()`` is the bare model's. A checkpoint
written from a torch DDP therefore has the keys of minidist's and the reverse.
``load_state_dict`` takes either form: keys that all start with ``module.`` (torch's DDP
state dict) or keys that all lack it (``model.module.state_dict()``, the common way to save).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Iterator

PREFIX = "module."  # torch's: the wrapped model is DDP's child named "module"


def _prefixed(prefix: str) -> str:
    return f"{prefix}.module" if prefix else "module"


class ModulePassThrough:
    """Mixin: ``parameters``, ``state_dict``, ``train``, ... of ``self.module``, with torch's
    ``module.`` prefix on every name."""

    module: Any

    def parameters(self, recurse: bool = True) -> Iterator[Any]:
        """The wrapped module's parameters (the same objects)."""
        return iter(self.module.parameters())

    def named_parameters(self, prefix: str = "", recurse: bool = True,
                         remove_duplicate: bool = True) -> Iterator[tuple[str, Any]]:
        """``("module.fc.weight", p)`` pairs, as torch's DDP names them."""
        return iter(self.module.named_parameters(_prefixed(prefix)))

    def buffers(self, recurse: bool = True) -> Iterator[Any]:
        return (b for _, b in self.module.named_buffers())

    def named_buffers(self, prefix: str = "", recurse: bool = True,
                      remove_duplicate: bool = True) -> Iterator[tuple[str, Any]]:
        """``("module.bn.running_mean", t)`` pairs, as torch's DDP names them."""
        return iter(self.module.named_buffers(_prefixed(prefix)))

    def children(self) -> Iterator[Any]:
        yield self.module

    def named_children(self) -> Iterator[tuple[str, Any]]:
        yield "module", self.module

    def modules(self) -> Iterator[Any]:
        return (m for _, m in self.named_modules())

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Any]]:
        """This wrapper (name ``prefix``), then the wrapped model as ``module`` and its
        sub-modules as ``module.<name>``, as torch's DDP."""
        yield prefix, self
        yield from self.module.named_modules(_prefixed(prefix))

    def state_dict(self) -> OrderedDict[str, Any]:
        """The wrapped module's state dict with torch's ``module.`` prefix on every key
        (``ddp.module.state_dict()`` is the bare model's)."""
        return OrderedDict((PREFIX + k, v) for k, v in self.module.state_dict().items())

    def load_state_dict(self, state_dict: Any, strict: bool = True) -> Any:
        """Load into the wrapped module: keys with torch's ``module.`` prefix (a DDP state
        dict, minidist's or torch's), or keys without it (a bare model's state dict).

        A dict whose keys all start with ``module.`` has the prefix removed; any other dict is
        loaded as it is, so a mix of both forms reports the prefixed keys as unexpected.
        Missing and unexpected keys come back as the wrapped module names them.
        """
        if state_dict and all(isinstance(k, str) and k.startswith(PREFIX) for k in state_dict):
            state_dict = OrderedDict((k[len(PREFIX):], v) for k, v in state_dict.items())
        return self.module.load_state_dict(state_dict, strict=strict)

    def train(self, mode: bool = True) -> Any:
        self.module.train(mode)
        return self

    def eval(self) -> Any:
        self.module.eval()
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the gradients (None grads become bucket views again when backward reaches them)."""
        self.module.zero_grad(set_to_none=set_to_none)


__all__ = ["ModulePassThrough", "PREFIX"]
