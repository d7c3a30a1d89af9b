"""Independent NumPy references for every optimizer's update rule.

Each function is torch's documented algorithm for one parameter, written out step by step in
float64 with nothing shared with ``minidist.optim`` (no kernels, no helpers), so a test that
compares the library with it checks the maths even where torch is not installed::

    state = {}
    for g in grads:
        p = adam(p, g, state, lr=1e-3)       # returns the new parameter, updates ``state``

``state`` holds the same buffers torch keeps (``exp_avg``, ``square_avg``, ...) under the same
names, plus ``step``.
"""

from __future__ import annotations

import numpy as np


def sgd(p, g, state, lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False):
    if weight_decay != 0:
        g = g + weight_decay * p
    if momentum != 0:
        if "momentum_buffer" not in state:
            buf = g.copy()
        else:
            buf = momentum * state["momentum_buffer"] + (1 - dampening) * g
        state["momentum_buffer"] = buf
        g = g + momentum * buf if nesterov else buf
    return p - lr * g


def adam(p, g, state, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False,
         decoupled=False):
    """Adam; ``decoupled=True`` is AdamW (the decay multiplies the parameter, not the grad)."""
    b1, b2 = betas
    t = state.get("step", 0) + 1
    state["step"] = t
    if weight_decay != 0:
        if decoupled:
            p = p * (1 - lr * weight_decay)
        else:
            g = g + weight_decay * p
    m = b1 * state.get("exp_avg", np.zeros_like(p)) + (1 - b1) * g
    v = b2 * state.get("exp_avg_sq", np.zeros_like(p)) + (1 - b2) * g * g
    state["exp_avg"], state["exp_avg_sq"] = m, v
    bias1, bias2 = 1 - b1 ** t, 1 - b2 ** t
    if amsgrad:
        vmax = np.maximum(state.get("max_exp_avg_sq", np.zeros_like(p)), v)
        state["max_exp_avg_sq"] = vmax
        denom = np.sqrt(vmax) / np.sqrt(bias2) + eps
    else:
        denom = np.sqrt(v) / np.sqrt(bias2) + eps
    return p - (lr / bias1) * m / denom


def adamw(p, g, state, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
          amsgrad=False):
    return adam(p, g, state, lr, betas, eps, weight_decay, amsgrad, decoupled=True)


def adadelta(p, g, state, lr=1.0, rho=0.9, eps=1e-6, weight_decay=0.0, maximize=False):
    state["step"] = state.get("step", 0) + 1
    if maximize:
        g = -g
    if weight_decay != 0:
        g = g + weight_decay * p
    sq = rho * state.get("square_avg", np.zeros_like(p)) + (1 - rho) * g * g
    acc = state.get("acc_delta", np.zeros_like(p))
    delta = np.sqrt(acc + eps) / np.sqrt(sq + eps) * g
    state["square_avg"] = sq
    state["acc_delta"] = rho * acc + (1 - rho) * delta * delta
    return p - lr * delta


def adagrad(p, g, state, lr=1e-2, lr_decay=0.0, weight_decay=0.0, initial_accumulator_value=0.0,
            eps=1e-10, maximize=False):
    t = state.get("step", 0) + 1
    state["step"] = t
    if maximize:
        g = -g
    if weight_decay != 0:
        g = g + weight_decay * p
    clr = lr / (1 + (t - 1) * lr_decay)
    total = state.get("sum", np.full_like(p, initial_accumulator_value)) + g * g
    state["sum"] = total
    return p - clr * g / (np.sqrt(total) + eps)


def rmsprop(p, g, state, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0,
            centered=False, maximize=False):
    state["step"] = state.get("step", 0) + 1
    if maximize:
        g = -g
    if weight_decay != 0:
        g = g + weight_decay * p
    sq = alpha * state.get("square_avg", np.zeros_like(p)) + (1 - alpha) * g * g
    state["square_avg"] = sq
    if centered:
        ga = alpha * state.get("grad_avg", np.zeros_like(p)) + (1 - alpha) * g
        state["grad_avg"] = ga
        avg = np.sqrt(sq - ga * ga) + eps
    else:
        avg = np.sqrt(sq) + eps
    if momentum > 0:
        buf = momentum * state.get("momentum_buffer", np.zeros_like(p)) + g / avg
        state["momentum_buffer"] = buf
        return p - lr * buf
    return p - lr * g / avg


RULES = {"SGD": sgd, "Adam": adam, "AdamW": adamw, "Adadelta": adadelta, "Adagrad": adagrad,
         "RMSprop": rmsprop}
