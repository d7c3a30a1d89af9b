"""Stochastic gradient descent with momentum, dampening, weight decay and Nesterov: torch's SGD.

    opt = SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    loss.backward(); opt.step(); opt.zero_grad()

The update, per parameter p with gradient g (torch.optim.SGD, step t = 1, 2, ...)::

    g   = g + weight_decay * p                       (if weight_decay != 0; L2 in the gradient)
    buf = g                                          (t == 1: no dampening on the first step)
    buf = momentum * buf + (1 - dampening) * g       (t > 1)
    g   = g + momentum * buf   if nesterov  else  buf      (if momentum != 0)
    p   = p - lr * g

All of it runs in place on ``p.array`` with one or two work buffers per parameter, allocated on
first use, so steady-state steps allocate no arrays (tests/unit/test_optim.py checks it).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from minidist import xp as backend
from minidist.logger import rank_prefix
from minidist.optim import fused as fused_step
from minidist.optim.optimizer import Optimizer, _required
from minidist.optim.options import run_closure
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

    def step(self, closure: Any = None) -> Any:
        """One update of every parameter with a gradient (fused groups: compiled kernels);
        ``closure`` as in torch (re-evaluates the model, its loss is returned)."""
        loss = None if closure is None else run_closure(closure)
        if any(g.get("fused") or g.get("foreach") for g in self.param_groups):
            fused_step.step(self, self._update)
            return loss
        i = 0                                        # the parameter's index in state_dict
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._update(i, p, group)
                i += 1
        return loss

    def _update(self, i: int, p: Any, group: dict[str, Any]) -> None:
        """torch's single-tensor SGD for parameter ``i``: whole-array ops, in place."""
        xp = backend.get_array_module(p.array)
        lr, momentum, wd = group["lr"], group["momentum"], group["weight_decay"]
        param, d = p.array, p.grad.array
        out = self.scratch(i, param, 0)              # p - lr * d: one reusable work buffer
        if wd != 0:                                  # d = g + wd * p  (the grad itself is kept)
            xp.multiply(param, wd, out=out)
            xp.add(out, d, out=out)
            d = out
        if momentum != 0:
            state = self.state[i]
            buf = state.get("momentum_buffer")
            if buf is None:                          # first step: buf = d, no dampening
                buf = state["momentum_buffer"] = xp.array(d, copy=True)
            else:
                xp.multiply(buf, momentum, out=buf)
                if group["dampening"] != 0:          # buf += (1 - dampening) * d
                    tmp = self.scratch(i, param, 1)
                    xp.multiply(d, 1.0 - group["dampening"], out=tmp)
                    xp.add(buf, tmp, out=buf)
                else:
                    xp.add(buf, d, out=buf)
            if group["nesterov"]:                    # d = d + momentum * buf
                tmp = self.scratch(i, param, 1)
                xp.multiply(buf, momentum, out=tmp)
                xp.add(d, tmp, out=out)
                d = out
            else:
                d = buf
        xp.multiply(d, lr, out=out)                  # p = p - lr * d
        xp.subtract(param, out, out=param)


# ----------------------------------------------------------------- the fused step (fused=True)
# One element of ``_update``, as scalar Python, in the same order of operations (float
# arithmetic is not associative), so the compiled loops give the same bits:
#   d = p * wd + g                       (_update: out = param * wd; out = out + g)
#   buf = d                  (first step)
#   buf = buf * momentum + d * keep      (keep = 1 - dampening; d * 1.0 == d exactly)
#   d = d + buf * momentum   (nesterov)  else  d = buf
#   p = p - d * lr

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
    if first:
        buf = d
    else:
        buf = buf * momentum + d * keep
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
