"""torch's other grad-mode switches (not in the spine): ``set_grad_enabled`` (as a call or a
context manager) and ``inference_mode`` (here ``no_grad`` under another name)."""

from __future__ import annotations

import functools
from typing import Any

from minidist.tensor.grad_mode import F, set_grad_mode, is_grad_enabled, no_grad


class set_grad_enabled:  # noqa: N801 - torch's name
    """Turn tape recording on or off for this thread: as a call, or as a context manager.

        set_grad_enabled(False)              # off from here on (a plain call, as torch)
        with set_grad_enabled(is_train):     # on or off inside the block, restored after
            out = model(x)

    The mode changes when the object is created; ``__exit__`` restores the mode from before.
    """

    def __init__(self, mode: bool) -> None:
        self._prev = is_grad_enabled()
        set_grad_mode(mode)

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        set_grad_mode(self._prev)


class inference_mode(no_grad):  # noqa: N801 - torch's name
    """torch's ``inference_mode(mode=True)``: here the same as ``no_grad`` (no tape inside the
    block; minidist has no separate inference tensors), ``mode=False`` changes nothing.

        with minidist.inference_mode():
            logits = model(x)

        @minidist.inference_mode()        # or @minidist.inference_mode, as torch allows
        def evaluate(model, loader): ...
    """

    def __new__(cls, mode: Any = True) -> Any:
        if callable(mode):  # used bare as a decorator: @inference_mode
            return cls()(mode)
        return super().__new__(cls)

    def __init__(self, mode: bool = True) -> None:
        self.mode = bool(mode)

    def __enter__(self) -> None:
        self._prev = is_grad_enabled()
        if self.mode:
            set_grad_mode(False)

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with inference_mode(self.mode):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


__all__ = ["inference_mode", "set_grad_enabled"]
