"""Adam and AdamW, with torch's update formulas (bias correction; L2 vs decoupled weight decay).

    opt = AdamW(model.parameters(), lr=1e-3, weight_decay=1e-2)

Per parameter p with gradient g, at step t = 1, 2, ... (torch.optim.Adam / AdamW)::

    AdamW only:  p = p * (1 - lr * weight_decay)      decoupled decay, before the update
    Adam only:   g = g + weight_decay * p             L2 penalty folded into the gradient
    m = beta1 * m + (1 - beta1) * g                   exp_avg
    v = beta2 * v + (1 - beta2) * g * g               exp_avg_sq
    v_max = max(v_max, v)                             amsgrad only (v_max starts at 0)
    denom = sqrt(v or v_max) / sqrt(1 - beta2**t) + eps
    p = p - lr / (1 - beta1**t) * m / denom

The state of each parameter is ``{"step": int, "exp_avg": arr, "exp_avg_sq": arr}`` (and
``"max_exp_avg_sq"`` with amsgrad), the same keys as torch's (``step`` is a plain int here). Updates run in place with two preallocated work
buffers per parameter.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from minidist import xp as backend
from minidist.kernels.optim_math import sqrt
from minidist.logger import rank_prefix
from minidist.optim import fused as fused_step
from minidist.optim.optimizer import Optimizer
from minidist.optim.registry import FusedStep, register


class Adam(Optimizer):
    """torch.optim.Adam: ``Adam(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
    amsgrad=False)``.

    Args:
        params: parameters or parameter groups (see ``Optimizer``).
        lr: learning rate.
        betas: decay rates of the first and second moment averages.
        eps: added to the denominator for numerical stability.
        weight_decay: L2 penalty added to the gradient (Adam) or decoupled decay (AdamW).
        amsgrad: divide by the running maximum of the second moment (Reddi et al., 2018).
        foreach: torch's multi-tensor step; here the same compiled kernels as ``fused``.
        fused: one compiled pass per flat buffer (``minidist.optim.fused``; same results on
            the CPU; amsgrad groups take the default path). None/False: the NumPy/CuPy path.

    Raises:
        ValueError: lr, eps or weight_decay negative, or a beta outside [0, 1).
        RuntimeError: fused and foreach both True (torch's rule).
    """

    state_keys = ("step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq")
    decoupled = False  # AdamW sets True

    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, amsgrad: bool = False, *,
                 foreach: bool | None = None, fused: bool | None = None) -> None:
        name = type(self).__name__
        for key, value in (("lr", lr), ("eps", eps), ("weight_decay", weight_decay)):
            if value < 0.0:
                raise ValueError(f"{rank_prefix()} {name}: invalid {key}={value}; it must be >= 0.")
        for j, beta in enumerate(betas):
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"{rank_prefix()} {name}: invalid betas[{j}]={beta}; each beta "
                                 "must be in [0, 1), e.g. betas=(0.9, 0.999).")
        fused_step.check_flags(name, foreach, fused)
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay, amsgrad=bool(amsgrad),
                                      foreach=foreach, fused=fused))

    def fused_kernel(self, group: dict[str, Any]) -> FusedStep:
        """The registry entry of ``fused=True`` (amsgrad groups take ``_update``)."""
        return ADAMW_STEP if self.decoupled else ADAM_STEP

    def _update(self, i: int, p: Any, group: dict[str, Any]) -> None:
        xp = backend.get_array_module(p.array)
        lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
        beta1, beta2 = group["betas"]
        param, g = p.array, p.grad.array
        state = self.state.setdefault(i, {})
        if not state:
            state["step"] = 0
            state["exp_avg"] = xp.zeros_like(param)
            state["exp_avg_sq"] = xp.zeros_like(param)
            if group.get("amsgrad"):
                state["max_exp_avg_sq"] = xp.zeros_like(param)
        state["step"] += 1
        t = state["step"]
        m, v = state["exp_avg"], state["exp_avg_sq"]
        a, b = self.scratch(i, param, 0), self.scratch(i, param, 1)

        if wd != 0:
            if self.decoupled:                       # AdamW: p *= 1 - lr * wd
                xp.multiply(param, 1.0 - lr * wd, out=param)
            else:                                    # Adam: g = g + wd * p
                xp.multiply(param, wd, out=a)
                xp.add(a, g, out=a)
                g = a
        xp.multiply(m, beta1, out=m)                 # m = beta1 m + (1 - beta1) g
        xp.multiply(g, 1.0 - beta1, out=b)
        xp.add(m, b, out=m)
        xp.multiply(v, beta2, out=v)                 # v = beta2 v + (1 - beta2) g g
        xp.multiply(g, g, out=b)
        xp.multiply(b, 1.0 - beta2, out=b)
        xp.add(v, b, out=v)

        bias_correction1 = 1.0 - beta1 ** t
        bias_correction2_sqrt = math.sqrt(1.0 - beta2 ** t)
        step_size = lr / bias_correction1
        if group.get("amsgrad"):                     # v_max = max(v_max, v): denom uses it
            v = xp.maximum(state["max_exp_avg_sq"], v, out=state["max_exp_avg_sq"])
        xp.sqrt(v, out=a)                            # denom = sqrt(v) / sqrt(bc2) + eps
        xp.divide(a, bias_correction2_sqrt, out=a)
        xp.add(a, eps, out=a)
        xp.divide(m, a, out=a)                       # p = p - step_size * m / denom
        xp.multiply(a, step_size, out=a)
        xp.subtract(param, a, out=param)


class AdamW(Adam):
    """torch.optim.AdamW: Adam with decoupled weight decay ``p *= 1 - lr * weight_decay``.

    Same arguments as ``Adam``; ``weight_decay`` defaults to 1e-2 as in torch.
    """

    decoupled = True

    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, *,
                 foreach: bool | None = None, fused: bool | None = None) -> None:
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         amsgrad=amsgrad, foreach=foreach, fused=fused)


# ----------------------------------------------------------------- the fused step (fused=True)
# One element of ``_update``, as scalar Python, in the same order of operations (float
# arithmetic is not associative), so the compiled loops give the same bits:
#   p = p * decay                        (AdamW: 1 - lr * wd; Adam: 1.0, exact)
#   g = p * l2 + g                       (Adam's L2 term; AdamW: l2 = 0, skipped)
#   m = m * beta1 + g * (1 - beta1)
#   v = v * beta2 + (g * g) * (1 - beta2)
#   p = p - (m / (sqrt(v) / sqrt(1 - beta2^t) + eps)) * (lr / (1 - beta1^t))

def adam_element(p: Any, g: Any, m: Any, v: Any, decay: Any, l2: Any, beta1: Any,
                 one_minus_beta1: Any, beta2: Any, one_minus_beta2: Any,
                 bias_correction2_sqrt: Any, eps: Any, step_size: Any) -> tuple[Any, Any, Any]:
    """torch's Adam / AdamW for one element: ``(new_p, new_exp_avg, new_exp_avg_sq)``."""
    p = p * decay
    if l2 != 0:
        g = p * l2 + g
    m = m * beta1 + g * one_minus_beta1
    v = v * beta2 + (g * g) * one_minus_beta2
    denom = sqrt(v) / bias_correction2_sqrt + eps
    return p - (m / denom) * step_size, m, v


def adam_scalars(group: dict[str, Any], step: int, first: bool) -> tuple[Any, ...]:
    return (1.0, group["weight_decay"]) + _moment_scalars(group, step)


def adamw_scalars(group: dict[str, Any], step: int, first: bool) -> tuple[Any, ...]:
    lr, wd = group["lr"], group["weight_decay"]
    return (1.0 - lr * wd, 0.0) + _moment_scalars(group, step)


def _moment_scalars(group: dict[str, Any], step: int) -> tuple[Any, ...]:
    beta1, beta2 = group["betas"]
    return (beta1, 1.0 - beta1, beta2, 1.0 - beta2, math.sqrt(1.0 - beta2 ** step),
            group["eps"], group["lr"] / (1.0 - beta1 ** step))


ADAM_STEP = register(FusedStep("adam", adam_element, adam_scalars,
                               state=("exp_avg", "exp_avg_sq"), counts_steps=True))
ADAMW_STEP = register(FusedStep("adamw", adam_element, adamw_scalars,
                                state=("exp_avg", "exp_avg_sq"), counts_steps=True))
