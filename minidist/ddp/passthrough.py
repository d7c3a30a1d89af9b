"""The torch.nn.Module methods DistributedDataParallel passes to the module it wraps."""

from __future__ import annotations

from typing import Any, Iterator


class ModulePassThrough:
    """Mixin: ``parameters``, ``state_dict``, ``train``, ... of ``self.module`` (torch keys:
    no ``module.`` prefix)."""

    module: Any

    def parameters(self) -> Iterator[Any]:
        """The wrapped module's parameters (the same objects)."""
        return iter(self.module.parameters())

    def named_parameters(self) -> Iterator[tuple[str, Any]]:
        """The wrapped module's named parameters, without a ``module.`` prefix."""
        return iter(self.module.named_parameters())

    def state_dict(self) -> dict[str, Any]:
        """The bare module's state dict (torch keys, no ``module.`` prefix)."""
        return self.module.state_dict()

    def load_state_dict(self, state_dict: Any, strict: bool = True) -> Any:
        """Load into the bare module (keys without a ``module.`` prefix)."""
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


__all__ = ["ModulePassThrough"]
