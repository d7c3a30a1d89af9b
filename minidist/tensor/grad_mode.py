"""Grad mode: whether tensor ops record the autograd tape (on by default, per thread).

    from minidist.tensor import no_grad, is_grad_enabled
    with no_grad():              # evaluation, optimizer updates: no tape, no hooks
        logits = model(x)
    assert is_grad_enabled()     # restored on exit, even after an exception

The flag is thread-local, like torch's: a communication thread never changes what the training
thread records.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable, TypeVar

_state = threading.local()
F = TypeVar("F", bound=Callable[..., Any])


def is_grad_enabled() -> bool:
    """True when ops on tensors that require grad record the tape (this thread)."""
    return getattr(_state, "enabled", True)


def _set(enabled: bool) -> None:
    _state.enabled = bool(enabled)


class set_grad_enabled:  # noqa: N801 - torch's name
    """Turn tape recording on or off for this thread: as a call, or as a context manager.

        set_grad_enabled(False)              # off from here on (a plain call, as torch)
        with set_grad_enabled(is_train):     # on or off inside the block, restored after
            out = model(x)

    The mode changes when the object is created; ``__exit__`` restores the mode from before.
    """

    def __init__(self, mode: bool) -> None:
        self._prev = is_grad_enabled()
        _set(mode)

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        _set(self._prev)


class no_grad:  # noqa: N801 - torch's name
    """Context manager (and decorator) that turns the tape off inside its block.

    Ops inside produce tensors with ``requires_grad=False``; nothing is recorded, so
    ``backward`` cannot reach through them and post-accumulate-grad hooks never fire.
    The previous mode is restored in ``finally``.
    """

    def __enter__(self) -> None:
        self._prev = is_grad_enabled()
        _set(False)

    def __exit__(self, *exc: object) -> None:
        _set(self._prev)

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with no_grad():
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


class enable_grad(no_grad):  # noqa: N801 - torch's name
    """Context manager that turns the tape back on inside a ``no_grad`` block."""

    def __enter__(self) -> None:
        self._prev = is_grad_enabled()
        _set(True)


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
            _set(False)

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with inference_mode(self.mode):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

