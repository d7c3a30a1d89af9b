"""One element of each fused optimizer step, as scalar Python: the logic every backend compiles.

    p, buf = sgd_element(p, g, buf, lr, momentum, keep, weight_decay, nesterov, first)
    p, m, v = adam_element(p, g, m, v, decay, l2, beta1, one_minus_beta1, beta2,
                           one_minus_beta2, bias_correction2_sqrt, eps, step_size)

``optim_cpu.py`` compiles these with ``njit(inline="always")``, ``optim_cuda.py`` with
``cuda.jit(device=True)``; called on NumPy scalars they are also the simulator's oracle. All
arguments are scalars of the parameter's dtype (float32 or float64), so every operation rounds
once in that dtype, in the same order as the per-parameter NumPy path of ``minidist.optim``
(``SGD._update`` / ``Adam._update``): the fused CPU step gives the same bits. Numba caches
optim_cpu.py's machine code keyed on optim_cpu.py's own file stamp: after editing this file,
touch optim_cpu.py so the cache is rebuilt.

Why the operations are written in exactly this order (float arithmetic is not associative):

    SGD   d = p * wd + g                       (sgd.py: out = param * wd; out = out + g)
          buf = d                  (first step)
          buf = buf * momentum + d * keep      (keep = 1 - dampening; d * 1.0 == d exactly)
          d = d + buf * momentum   (nesterov)  else  d = buf
          p = p - d * lr
    Adam  p = p * decay                        (AdamW: 1 - lr * wd; Adam: 1.0, exact)
          g = p * l2 + g                       (Adam's L2 term; AdamW: l2 = 0, skipped)
          m = m * beta1 + g * (1 - beta1)
          v = v * beta2 + (g * g) * (1 - beta2)
          p = p - (m / (sqrt(v) / sqrt(1 - beta2^t) + eps)) * (lr / (1 - beta1^t))
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minidist import xp as backend


def sgd_element(p: Any, g: Any, buf: Any, lr: Any, momentum: Any, keep: Any,
                weight_decay: Any, nesterov: bool, first: bool) -> tuple[Any, Any]:
    """torch's SGD for one element: returns ``(new_p, new_momentum_buffer)``.

    ``buf`` is ignored when ``momentum == 0`` (no buffer; the returned one is meaningless).
    """
    d = g
    if weight_decay != 0:
        d = p * weight_decay + d
    if momentum != 0:
        if first:
            buf = d
        else:
            buf = buf * momentum + d * keep
        if nesterov:
            d = d + buf * momentum
        else:
            d = buf
    return p - d * lr, buf


def make_adam_element(sqrt: Any) -> Any:
    """``adam_element`` with the given square root: ``np.sqrt`` on the CPU and in the simulator
    (it keeps a float32 scalar float32), ``math.sqrt`` for numba.cuda (which has no ``np.sqrt``
    on scalars; on float32 it is ``sqrt.rn.f32``, correctly rounded like NumPy's)."""

    def adam_element(p: Any, g: Any, m: Any, v: Any, decay: Any, l2: Any, beta1: Any,
                     one_minus_beta1: Any, beta2: Any, one_minus_beta2: Any,
                     bias_correction2_sqrt: Any, eps: Any, step_size: Any
                     ) -> tuple[Any, Any, Any]:
        """torch's Adam / AdamW for one element: ``(new_p, new_exp_avg, new_exp_avg_sq)``."""
        p = p * decay
        if l2 != 0:
            g = p * l2 + g
        m = m * beta1 + g * one_minus_beta1
        v = v * beta2 + (g * g) * one_minus_beta2
        denom = sqrt(v) / bias_correction2_sqrt + eps
        return p - (m / denom) * step_size, m, v

    return adam_element


adam_element = make_adam_element(np.sqrt)


# ----------------------------------------------------------------- whole-array references

def sgd_step_reference(p: Any, g: Any, buf: Any, lr: Any, momentum: Any, keep: Any,
                       weight_decay: Any, nesterov: bool, first: bool) -> None:
    """``sgd_element`` on whole NumPy/CuPy arrays, in place: what the kernels compute, used
    when they cannot run (the same operations in the same order: the same bits)."""
    new_p, new_buf = sgd_element(p, g, buf, lr, momentum, keep, weight_decay, nesterov, first)
    if momentum != 0:
        buf[...] = new_buf
    p[...] = new_p


def adam_step_reference(p: Any, g: Any, m: Any, v: Any, *scalars: Any) -> None:
    """``adam_element`` on whole NumPy/CuPy arrays, in place (see ``sgd_step_reference``)."""
    new_p, new_m, new_v = adam_element(p, g, m, v, *scalars)
    m[...] = new_m
    v[...] = new_v
    p[...] = new_p


def sgd_multi_step_reference(base: Any, table: Any, max_numel: int, *scalars: Any) -> None:
    """``sgd_step_reference`` on each tensor of a multi-tensor table (see ``multi_tensor``):
    row k of ``table`` holds the element offsets of p, g, buf in ``base`` and the numel."""
    for p, g, buf in _columns(base, table, 3):
        sgd_step_reference(p, g, buf, *scalars)


def adam_multi_step_reference(base: Any, table: Any, max_numel: int, *scalars: Any) -> None:
    """``adam_step_reference`` on each tensor of a multi-tensor table (p, g, m, v, numel)."""
    for p, g, m, v in _columns(base, table, 4):
        adam_step_reference(p, g, m, v, *scalars)


def _columns(base: Any, table: Any, k: int) -> list[tuple[Any, ...]]:
    rows = backend.to_host(table, op="fused optimizer (the reference fallback reads its table)")
    return [tuple(base[int(o):int(o) + int(row[k])] for o in row[:k]) for row in rows]


def rehearsal_table(xp: Any, dtype: Any, columns: int, numel: int) -> tuple[Any, Any]:
    """A small private ``(base, table)`` for rehearsing a multi-tensor op: two tensors of
    ``numel`` and 1 elements, each column its own stretch of ``base`` (random, finite)."""
    sizes = (numel, 1)
    total = columns * sum(sizes)
    base = xp.asarray(np.random.default_rng(0).uniform(0.5, 1.0, total).astype(dtype))
    rows, offset = [], 0
    for n in sizes:
        rows.append([offset + c * n for c in range(columns)] + [n])
        offset += columns * n
    return base, xp.asarray(np.array(rows, dtype=np.int64))


def signature(op: str, *args: Any) -> tuple:
    """What selects a compiled specialization (``minidist.kernels.fallback`` rehearses each
    once): the op and the parameter array's type and dtype; every other array and scalar of a
    call has that dtype (``minidist.optim.fused`` makes sure), the flags are bools. Cheaper
    than the default signature, which looks at every argument (~6 us a call)."""
    first = args[0]
    return op, type(first), first.dtype.char
