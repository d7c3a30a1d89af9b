"""RMSprop: torch.optim.RMSprop's update, as a plain ``step()`` over ``param_groups``.

    opt = RMSprop(model.parameters(), lr=1e-2, alpha=0.99, momentum=0.9, centered=True)

Per parameter p with gradient g (torch's single-tensor formula)::

    g = -g                                             (maximize)
    g = g + weight_decay * p                           (if weight_decay != 0)
    square_avg = alpha * square_avg + (1 - alpha) * g * g
    centered:  grad_avg = alpha * grad_avg + (1 - alpha) * g
               avg = sqrt(square_avg - grad_avg * grad_avg) + eps
    else:      avg = sqrt(square_avg) + eps
    momentum > 0:  buf = momentum * buf + g / avg;  p = p - lr * buf
    else:          p = p - lr * g / avg

State per parameter (torch's keys): ``step``, ``square_avg``, and ``momentum_buffer`` (with
momentum) and ``grad_avg`` (centered).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from minidist import xp as backend
from minidist.optim.optimizer import Optimizer
from minidist.optim.options import check_options, run_closure


class RMSprop(Optimizer):
    """torch.optim.RMSprop: ``RMSprop(params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0,
    momentum=0, centered=False, capturable=False, foreach=None, maximize=False,
    differentiable=False)``; ``capturable`` and ``differentiable`` must stay off.

    Raises:
        ValueError: a negative option, or capturable/differentiable asked for.
    """

    state_keys = ("step", "square_avg", "momentum_buffer", "grad_avg")

    def __init__(self, params: Iterable[Any], lr: float = 1e-2, alpha: float = 0.99,
                 eps: float = 1e-8, weight_decay: float = 0.0, momentum: float = 0.0,
                 centered: bool = False, capturable: bool = False, foreach: bool | None = None,
                 maximize: bool = False, differentiable: bool = False) -> None:
        check_options("RMSprop", dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay,
                                      momentum=momentum),
                      capturable=capturable, differentiable=differentiable)
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay,
                                      momentum=momentum, centered=centered, foreach=foreach,
                                      maximize=maximize))

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One RMSprop update of every parameter that has a gradient; returns the closure's loss."""
        loss = run_closure(closure)
        for group in self.param_groups:
            alpha, eps, lr = group["alpha"], group["eps"], group["lr"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                xp = backend.get_array_module(p.array)
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["square_avg"] = xp.zeros_like(p.array)
                    if group["momentum"] > 0:
                        state["momentum_buffer"] = xp.zeros_like(p.array)
                    if group["centered"]:
                        state["grad_avg"] = xp.zeros_like(p.array)
                state["step"] += 1
                g = -p.grad.array if group["maximize"] else p.grad.array
                if group["weight_decay"] != 0:
                    g = g + group["weight_decay"] * p.array
                sq = state["square_avg"]
                sq *= alpha
                sq += (1 - alpha) * g * g
                if group["centered"]:
                    ga = state["grad_avg"]
                    ga += (g - ga) * (1 - alpha)                 # torch's lerp_(g, 1 - alpha)
                    avg = xp.sqrt(sq - ga * ga) + eps
                else:
                    avg = xp.sqrt(sq) + eps
                if group["momentum"] > 0:
                    buf = state["momentum_buffer"]
                    buf *= group["momentum"]
                    buf += g / avg
                    p.array -= lr * buf
                else:
                    p.array -= lr * (g / avg)
        return loss
