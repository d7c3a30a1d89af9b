"""Adadelta: torch.optim.Adadelta's update, as a plain ``step()`` over ``param_groups``.

    opt = Adadelta(model.parameters(), lr=1.0, rho=0.9)

Per parameter p with gradient g (torch's single-tensor formula)::

    g = -g                                              (maximize)
    g = g + weight_decay * p                            (if weight_decay != 0)
    square_avg = rho * square_avg + (1 - rho) * g * g
    delta = sqrt(acc_delta + eps) / sqrt(square_avg + eps) * g
    acc_delta = rho * acc_delta + (1 - rho) * delta * delta
    p = p - lr * delta

State per parameter (torch's keys): ``step``, ``square_avg``, ``acc_delta``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from minidist import xp as backend
from minidist.optim.optimizer import Optimizer
from minidist.optim.options import check_options, run_closure


class Adadelta(Optimizer):
    """torch.optim.Adadelta: ``Adadelta(params, lr=1.0, rho=0.9, eps=1e-6, weight_decay=0,
    foreach=None, *, capturable=False, maximize=False, differentiable=False)``;
    ``capturable`` and ``differentiable`` must stay off.

    Raises:
        ValueError: a negative option, rho above 1, or capturable/differentiable asked for.
    """

    state_keys = ("step", "square_avg", "acc_delta")

    def __init__(self, params: Iterable[Any], lr: float = 1.0, rho: float = 0.9,
                 eps: float = 1e-6, weight_decay: float = 0.0, foreach: bool | None = None, *,
                 capturable: bool = False, maximize: bool = False,
                 differentiable: bool = False) -> None:
        check_options("Adadelta", dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay),
                      capturable=capturable, differentiable=differentiable)
        if rho > 1.0:
            raise ValueError(f"Adadelta: invalid rho={rho}; it must be in [0, 1].")
        super().__init__(params, dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay,
                                      foreach=foreach, maximize=maximize))

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One Adadelta update of every parameter that has a gradient; returns the closure's loss."""
        loss = run_closure(closure)
        for group in self.param_groups:
            rho, eps = group["rho"], group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                xp = backend.get_array_module(p.array)
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["square_avg"] = xp.zeros_like(p.array)
                    state["acc_delta"] = xp.zeros_like(p.array)
                state["step"] += 1
                g = -p.grad.array if group["maximize"] else p.grad.array
                if group["weight_decay"] != 0:
                    g = g + group["weight_decay"] * p.array
                sq, acc = state["square_avg"], state["acc_delta"]
                sq *= rho
                sq += (1 - rho) * g * g
                delta = xp.sqrt(acc + eps) / xp.sqrt(sq + eps) * g
                acc *= rho
                acc += (1 - rho) * delta * delta
                p.array -= group["lr"] * delta
        return loss
