"""Stochastic gradient descent with momentum, dampening, weight decay and Nesterov: torch's SGD.

    opt = SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    loss.backward(); opt.step(); opt.zero_grad()

The update, per parameter p with gradient g (torch.optim.SGD, step t = 1, 2, ...)::

    g   = g + weight_decay * p                       (if weight_decay != 0; L2 in the gradient)
    buf = g                                          (t == 1: no dampening on the first step)
    buf = momentum * buf + (1 - dampening) * g       (t > 1)
    g   = g + momentum * buf   if nesterov  else  buf      (if momentum != 0)
    p   = p - lr * g

The update is written once, for one element (``sgd_momentum_element`` below): the default path
runs it on whole arrays in place, with one work buffer per parameter allocated on first use,
so steady-state steps allocate no arrays (tests/optim/test_optim.py checks it).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from minidist.logger import rank_prefix
from minidist.optim import fused as fused_step
from minidist.optim.optimizer import Optimizer, _required
from minidist.optim.registry import FusedStep, register


class SGD(Optimizer):
    """torch.optim.SGD: ``SGD(params, lr, momentum=0, dampening=0, weight_decay=0, nesterov=False)``.

    Args:
        params: parameters or parameter groups (see ``Optimizer``).
        lr: learning rate.
        momentum: momentum factor (0 = plain SGD).
        dampening: scales the new gradient in the momentum buffer (not on the first step).
        weight_decay: L2 penalty, added to the gradient.
        nesterov: use Nesterov momentum (needs momentum > 0 and dampening == 0).
        foreach: torch's multi-tensor step; here the same compiled kernels as ``fused``.
        fused: one compiled pass per flat buffer (``minidist.optim.fused``; same results on
            the CPU). None/False: the NumPy/CuPy path.

    Raises:
        ValueError: a negative option, or nesterov with momentum <= 0 or dampening != 0.
        RuntimeError: fused and foreach both True (torch's rule).
    """

    state_keys = ("momentum_buffer",)

    def fused_kernel(self, group: dict[str, Any]) -> FusedStep:
        """The registry entry of ``fused=True``: with or without a momentum buffer."""
        return SGD_MOMENTUM if group["momentum"] != 0 else SGD_PLAIN

    def __init__(self, params: Iterable[Any], lr: float = _required, momentum: float = 0.0,
                 dampening: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False, *,
                 foreach: bool | None = None, fused: bool | None = None) -> None:
        for key, value in (("lr", lr), ("momentum", momentum), ("weight_decay", weight_decay)):
            if value is not _required and value < 0.0:
                raise ValueError(f"{rank_prefix()} SGD: invalid {key}={value}; it must be >= 0.")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError(f"{rank_prefix()} SGD: nesterov=True needs momentum > 0 and "
                             f"dampening == 0, got momentum={momentum}, dampening={dampening}.")
        fused_step.check_flags("SGD", foreach, fused)
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov,
                                      foreach=foreach, fused=fused))


# ----------------------------------------------------------------- the update, written once
# One element of the update, as scalar Python. The fused kernels compile it (fused=True); the
# default path runs it on whole arrays, in place (``Optimizer._update``, ``optim/inplace.py``),
# e.g. with momentum after the first step, for each parameter:
#   buf *= momentum;  buf += g;  tmp = buf * lr;  p -= tmp
# Both compute the same bits: the same operations in the same order (float arithmetic is not
# associative), and no operation whose result is known (``d * 1.0``, the dampening of 0).

def sgd_element(p: Any, g: Any, lr: Any, weight_decay: Any) -> tuple[Any]:
    """SGD without momentum, one element: ``(new_p,)``."""
    d = g
    if weight_decay != 0:
        d = p * weight_decay + d
    return (p - d * lr,)


def sgd_momentum_element(p: Any, g: Any, buf: Any, lr: Any, momentum: Any, keep: Any,
                         weight_decay: Any, nesterov: bool, first: bool) -> tuple[Any, Any]:
    """torch's SGD with momentum, one element: ``(new_p, new_momentum_buffer)``."""
    d = g
    if weight_decay != 0:
        d = p * weight_decay + d
    if first:                                        # the first step: buf = d
        buf = d
    elif keep != 1:                                  # keep = 1 - dampening
        buf = buf * momentum + d * keep
    else:
        buf = buf * momentum + d
    if nesterov:
        d = d + buf * momentum
    else:
        d = buf
    return p - d * lr, buf


def sgd_scalars(group: dict[str, Any], step: int, first: bool) -> tuple[Any, ...]:
    return group["lr"], group["weight_decay"]


def sgd_momentum_scalars(group: dict[str, Any], step: int, first: bool) -> tuple[Any, ...]:
    return (group["lr"], group["momentum"], 1.0 - group["dampening"], group["weight_decay"],
            bool(group["nesterov"]), first)


SGD_PLAIN = register(FusedStep("sgd", sgd_element, sgd_scalars))
SGD_MOMENTUM = register(FusedStep("sgd_momentum", sgd_momentum_element, sgd_momentum_scalars,
                                  state=("momentum_buffer",)))
