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
``"max_exp_avg_sq"`` with amsgrad), the same keys as torch's (``step`` is a plain int here).
The update is written once, for one element (``adam_element`` below), and runs in place with
one preallocated work buffer per parameter.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from numpy import maximum

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
        """The entry that updates ``group`` (amsgrad's has no compiled kernel: ``fused=True``
        runs it on whole arrays, as the default path does)."""
        if group.get("amsgrad"):
            return ADAMW_AMSGRAD if self.decoupled else ADAM_AMSGRAD
        return ADAMW_STEP if self.decoupled else ADAM_STEP


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


# ----------------------------------------------------------------- the update, written once
# One element of the update, as scalar Python. The fused kernels compile it (fused=True); the
# default path runs it on whole arrays, in place (``Optimizer._update``, ``optim/inplace.py``).
# Both compute the same bits: the same operations in the same order (float arithmetic is not
# associative), and none whose result is known (Adam's ``p * 1.0``, AdamW's ``l2 = 0`` term):
#   p = p * decay                        (AdamW: 1 - lr * wd)
#   g = p * l2 + g                       (Adam's L2 term)
#   m = m * beta1 + g * (1 - beta1)
#   v = v * beta2 + (g * g) * (1 - beta2)
#   p = p - (m / (sqrt(v) / sqrt(1 - beta2^t) + eps)) * (lr / (1 - beta1^t))

def adam_element(p: Any, g: Any, m: Any, v: Any, decay: Any, l2: Any, beta1: Any,
                 one_minus_beta1: Any, beta2: Any, one_minus_beta2: Any,
                 bias_correction2_sqrt: Any, eps: Any, step_size: Any,
                 v_max: Any = None) -> tuple[Any, ...]:
    """torch's Adam / AdamW for one element: ``(new_p, new_exp_avg, new_exp_avg_sq)``; with
    ``v_max`` (amsgrad) also ``new_max_exp_avg_sq``, the denominator's running maximum."""
    if decay != 1:
        p = p * decay
    if l2 != 0:
        g = p * l2 + g
    m = m * beta1 + g * one_minus_beta1
    v = v * beta2 + (g * g) * one_minus_beta2
    v_hat = v                                        # amsgrad: the running maximum of v
    if v_max is not None:                            # (the kernels compile without it)
        v_hat = maximum(v_max, v)
    p = p - (m / (sqrt(v_hat) / bias_correction2_sqrt + eps)) * step_size
    if v_max is None:
        return p, m, v
    return p, m, v, v_hat


def adam_amsgrad_element(p: Any, g: Any, m: Any, v: Any, v_max: Any,
                         *scalars: Any) -> tuple[Any, ...]:
    """Adam / AdamW with amsgrad, one element (no compiled kernel: the default path only)."""
    return adam_element(p, g, m, v, *scalars, v_max=v_max)  # type: ignore[misc]  # 9 scalars


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
ADAM_AMSGRAD = FusedStep("adam_amsgrad", adam_amsgrad_element, adam_scalars,
                         state=("exp_avg", "exp_avg_sq", "max_exp_avg_sq"), counts_steps=True)
ADAMW_AMSGRAD = FusedStep("adamw_amsgrad", adam_amsgrad_element, adamw_scalars,
                          state=("exp_avg", "exp_avg_sq", "max_exp_avg_sq"), counts_steps=True)
