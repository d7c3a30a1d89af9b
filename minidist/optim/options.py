"""What the optimizers written with the public ``step()`` share: option checks, the closure.

    check_options("RMSprop", dict(lr=lr, alpha=alpha), differentiable=False)
    loss = run_closure(closure)              # torch's step(closure): grad mode on
"""

from __future__ import annotations

from typing import Any, Callable

from minidist.logger import rank_prefix
from minidist.tensor import enable_grad


def check_options(name: str, values: dict[str, float], **off: Any) -> None:
    """Each of ``values`` must be >= 0; each of ``off`` (torch's flags minidist does not
    implement: differentiable, fused, capturable) must be falsy.

    Raises:
        ValueError: naming the option and what it must be.
    """
    for key, value in values.items():
        if value < 0.0:
            raise ValueError(f"{rank_prefix()} {name}: invalid {key}={value}; it must be >= 0.")
    for key, value in off.items():
        if value:
            raise ValueError(f"{rank_prefix()} {name}: {key}=True is not supported (one "
                             "NumPy/CuPy implementation); leave it at its default.")


def run_closure(closure: Callable[[], Any] | None) -> Any:
    """torch's ``step(closure)``: call it with grad mode on and return its loss (or None)."""
    if closure is None:
        return None
    with enable_grad():
        return closure()
