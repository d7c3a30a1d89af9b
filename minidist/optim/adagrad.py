"""Adagrad: torch.optim.Adagrad's update, written as a plain ``step()`` over ``param_groups``.

    opt = Adagrad(model.parameters(), lr=1e-2)

Per parameter p with gradient g, at step t = 1, 2, ... (torch's single-tensor formula)::

    g = -g                                   (maximize)
    g = g + weight_decay * p                 (if weight_decay != 0)
    clr = lr / (1 + (t - 1) * lr_decay)
    sum = sum + g * g                        (starts at initial_accumulator_value)
    p = p - clr * g / (sqrt(sum) + eps)

State per parameter: ``{"step": int, "sum": arr}`` (torch's keys). This class is also the
example of writing an optimizer with the public interface: ``step`` walks ``param_groups``
and keeps its state in ``self.state[p]`` (see ``minidist.optim.optimizer``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from minidist import xp as backend
from minidist.optim.optimizer import Optimizer
from minidist.optim.options import check_options, run_closure


class Adagrad(Optimizer):
    """torch.optim.Adagrad: ``Adagrad(params, lr=1e-2, lr_decay=0, weight_decay=0,
    initial_accumulator_value=0, eps=1e-10, foreach=None, *, maximize=False,
    differentiable=False, fused=None)``.

    ``foreach`` is accepted (one implementation); ``differentiable`` and ``fused`` must stay
    off.

    Raises:
        ValueError: a negative option, or differentiable/fused asked for.
    """

    state_keys = ("step", "sum")

    def __init__(self, params: Iterable[Any], lr: float = 1e-2, lr_decay: float = 0.0,
                 weight_decay: float = 0.0, initial_accumulator_value: float = 0.0,
                 eps: float = 1e-10, foreach: bool | None = None, *, maximize: bool = False,
                 differentiable: bool = False, fused: bool | None = None) -> None:
        check_options("Adagrad", dict(lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
                                      initial_accumulator_value=initial_accumulator_value,
                                      eps=eps), differentiable=differentiable, fused=fused)
        super().__init__(params, dict(lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
                                      initial_accumulator_value=initial_accumulator_value,
                                      eps=eps, foreach=foreach, maximize=maximize))

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One Adagrad update of every parameter that has a gradient; returns the closure's loss."""
        loss = run_closure(closure)
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                xp = backend.get_array_module(p.array)
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["sum"] = xp.full_like(p.array, group["initial_accumulator_value"])
                state["step"] += 1
                g = -p.grad.array if group["maximize"] else p.grad.array
                if group["weight_decay"] != 0:
                    g = g + group["weight_decay"] * p.array
                clr = group["lr"] / (1 + (state["step"] - 1) * group["lr_decay"])
                state["sum"] += g * g
                p.array -= clr * (g / (xp.sqrt(state["sum"]) + group["eps"]))
        return loss
