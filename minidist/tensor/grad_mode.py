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


def set_grad_mode(enabled: bool) -> None:  # no_grad's switch; torch's call: set_grad_enabled
    _state.enabled = bool(enabled)


class no_grad:  # noqa: N801 - torch's name
    """Context manager (and decorator) that turns the tape off inside its block.

    Ops inside produce tensors with ``requires_grad=False``; nothing is recorded, so
    ``backward`` cannot reach through them and post-accumulate-grad hooks never fire.
    The previous mode is restored in ``finally``.
    """

    def __enter__(self) -> None:
        self._prev = is_grad_enabled()
        set_grad_mode(False)

    def __exit__(self, *exc: object) -> None:
        set_grad_mode(self._prev)

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
        set_grad_mode(True)
