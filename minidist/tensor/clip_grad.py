"""Gradient clipping: ``clip_grad_norm_`` (by global norm) and ``clip_grad_value_``, as torch's
``torch.nn.utils``. One implementation, reachable as ``minidist.nn.utils.clip_grad_norm_`` (torch's
spelling) and ``minidist.optim.clip_grad_norm_``; it lives in the tensor layer, below both.

    loss.backward()
    total = clip_grad_norm_(model.parameters(), max_norm=1.0)   # the norm before clipping
    opt.step()

The norm is taken over all gradients as if they were one vector::

    total = ( sum over params of ||g_p||^q )^(1/q)        (q = norm_type; inf: max |g|)
    coef  = max_norm / (total + 1e-6)
    if coef < 1: every g_p *= coef          (in place: DDP bucket views stay valid)

Under DDP, clip after the all-reduce (gradients are identical on every rank, so every rank
computes the same norm and the same coefficient without any extra collective).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from minidist import xp as backend
from minidist.logger import rank_prefix


def clip_grad_norm_(parameters: Iterable[Any] | Any, max_norm: float, norm_type: float = 2.0,
                     error_if_nonfinite: bool = False, foreach: Any = None) -> float:
    """Scale all gradients in place so their global ``norm_type`` norm is at most ``max_norm``.

    Args:
        parameters: parameters (or one parameter); those with ``.grad is None`` are skipped.
        max_norm: the largest allowed total norm.
        norm_type: the p of the p-norm; ``float("inf")`` for the max norm.
        error_if_nonfinite: raise if the total norm is NaN or inf (else gradients become NaN).
        foreach: accepted for torch's signature; unused.

    Returns:
        The total norm of the gradients before clipping, as a float (0.0 if no gradients).

    Raises:
        ValueError: max_norm negative or norm_type <= 0.
        RuntimeError: ``error_if_nonfinite`` and the total norm is not finite.
    """
    if max_norm < 0 or not norm_type > 0:
        raise ValueError(f"{rank_prefix()} clip_grad_norm_: need max_norm >= 0 and norm_type > 0, "
                         f"got max_norm={max_norm}, norm_type={norm_type}.")
    params = [parameters] if hasattr(parameters, "grad") else list(parameters)
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    norm_type = float(norm_type)
    norms = []
    for g in grads:
        xp = backend.get_array_module(g)
        flat = g.reshape(-1)
        if norm_type == math.inf:
            norms.append(float(xp.max(xp.abs(flat))) if flat.size else 0.0)
        elif norm_type == 2.0:
            norms.append(math.sqrt(float(xp.dot(flat, flat))))  # no temporary array
        else:
            norms.append(float(xp.sum(xp.abs(flat) ** norm_type)) ** (1.0 / norm_type))
    if norm_type == math.inf:
        total = max(norms)
    else:
        total = math.fsum(n ** norm_type for n in norms) ** (1.0 / norm_type)
    if error_if_nonfinite and not math.isfinite(total):
        raise RuntimeError(f"{rank_prefix()} clip_grad_norm_: the total norm of order {norm_type} "
                           f"of {len(grads)} gradients is {total}. A loss or gradient overflowed; "
                           "lower the learning rate, or pass error_if_nonfinite=False.")
    coef = max_norm / (total + 1e-6)
    if coef < 1.0:
        for g in grads:
            g *= coef
    return total


def clip_grad_value_(parameters: Iterable[Any] | Any, clip_value: float,
                     foreach: Any = None) -> None:
    """Clamp every gradient element to ``[-clip_value, clip_value]`` in place (torch's
    ``clip_grad_value_``); parameters without a gradient are skipped."""
    if clip_value < 0:
        raise ValueError(f"{rank_prefix()} clip_grad_value_: clip_value must be >= 0, got "
                         f"{clip_value}.")
    params = [parameters] if hasattr(parameters, "grad") else list(parameters)
    for p in params:
        if p.grad is not None:
            backend.get_array_module(p.grad).clip(p.grad, -clip_value, clip_value, out=p.grad)
