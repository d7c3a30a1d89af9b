"""Numba CPU kernels for the fused optimizer steps: one pass over parameter, gradient and state.

    from minidist.kernels import optim_cpu     # imports numba; minidist.optim.fused does it lazily
    optim_cpu.adam_step(p, g, m, v, decay, l2, beta1, 1 - beta1, beta2, 1 - beta2, bc2, eps, step)
    optim_cpu.sgd_step(p, g, buf, lr, momentum, 1 - dampening, weight_decay, nesterov, first)

Arguments are 1-D C-contiguous arrays of one dtype (float32 or float64) and scalars of that
dtype; ``minidist.optim.fused`` checks and prepares them. Why one pass: the per-parameter NumPy
step of AdamW makes 14 whole-array passes (each reads one or two arrays and writes one), about
100 bytes of memory traffic per parameter; this loop reads p, g, m, v once and writes p, m, v
once (28 bytes for float32)::

    NumPy (optim/adam.py)                     this module
    p *= 1 - lr*wd          read p, write p   for i in range(n):
    m *= b1; b = g*(1-b1)   ...                   p_i, m_i, v_i = adam_element(p[i], g[i],
    m += b; v *= b2; ...    (14 passes,                                      m[i], v[i], ...)
    a = sqrt(v); a /= ...    2 temporaries)       p[i], m[i], v[i] = p_i, m_i, v_i

The element logic is ``optim_math``'s, inlined, in the same order of operations as the NumPy
path: the results are the same bits (tests/unit/test_fused_optim.py). The loop vectorizes
(AVX) because of two settings: ``error_model="numpy"`` (Python's error model checks every
division for zero and raises, a branch that stops vectorization; NumPy's gives IEEE inf/NaN,
as the NumPy path does) and no ``fastmath`` (which would let LLVM reassociate, and change bits).

Threads: as ``kernels/cpu.py``, ``prange`` only when ``NUMBA_NUM_THREADS`` is set and the array
is long (``PARALLEL_MIN_NUMEL``); otherwise one thread.
"""

from __future__ import annotations

import os
import threading
from typing import Any, NamedTuple

import numba
import numpy as np
from numba import njit, prange
from numba.core.errors import NumbaError

from minidist.kernels import optim_math
from minidist.kernels.fallback import private_copies

__all__ = ["sgd_step", "adam_step", "sgd_multi_step", "adam_multi_step", "COMPILE_ERRORS",
           "check_usable", "signature", "rehearse"]

COMPILE_ERRORS: tuple[type[BaseException], ...] = (NumbaError,)
"""Errors that mean "Numba cannot compile this here" (the caller falls back to NumPy)."""

_sgd_element = njit(inline="always", error_model="numpy")(optim_math.sgd_element)
_adam_element = njit(inline="always", error_model="numpy")(optim_math.adam_element)

# Numba's workqueue threading layer aborts when two Python threads run parallel kernels at once.
_PARALLEL_LOCK = threading.Lock()


class _Loops(NamedTuple):
    sgd: Any
    adam: Any
    sgd_multi: Any
    adam_multi: Any


def _compile_loops(parallel: bool) -> _Loops:
    """Both loops, from one source, with ``prange`` or ``range`` (see kernels/cpu.py: the
    closure variable keeps the two variants' cache entries apart)."""
    loop_range = prange if parallel else range
    jit = njit(parallel=parallel, cache=True, error_model="numpy")

    @jit
    def sgd(p: Any, g: Any, buf: Any, lr: Any, momentum: Any, keep: Any, weight_decay: Any,
            nesterov: bool, first: bool) -> None:  # pragma: no cover - compiled
        if momentum != 0:
            for i in loop_range(p.size):
                new_p, new_buf = _sgd_element(p[i], g[i], buf[i], lr, momentum, keep,
                                              weight_decay, nesterov, first)
                p[i] = new_p
                buf[i] = new_buf
        else:  # no momentum buffer: `buf` is not read (it may be any array)
            for i in loop_range(p.size):
                new_p, _ = _sgd_element(p[i], g[i], p[i], lr, momentum, keep, weight_decay,
                                        nesterov, first)
                p[i] = new_p

    @jit
    def adam(p: Any, g: Any, m: Any, v: Any, decay: Any, l2: Any, beta1: Any,
             one_minus_beta1: Any, beta2: Any, one_minus_beta2: Any, bias_correction2_sqrt: Any,
             eps: Any, step_size: Any) -> None:  # pragma: no cover - compiled
        for i in loop_range(p.size):
            new_p, new_m, new_v = _adam_element(p[i], g[i], m[i], v[i], decay, l2, beta1,
                                                one_minus_beta1, beta2, one_minus_beta2,
                                                bias_correction2_sqrt, eps, step_size)
            p[i] = new_p
            m[i] = new_m
            v[i] = new_v

    # Multi-tensor: every tensor of a (dtype) group in one call. ``base`` spans them all and
    # row k of ``table`` holds tensor k's element offsets in it, then its numel (multi_tensor).
    # Each tensor's columns are cut out of ``base`` as slices and run through the loop above:
    # indexing ``base[offset + j]`` directly would make Numba check each index for
    # wraparound (it cannot prove offset + j >= 0), which stops the loop vectorizing (~7x).
    @jit
    def sgd_multi(base: Any, table: Any, lr: Any, momentum: Any, keep: Any, weight_decay: Any,
                  nesterov: bool, first: bool) -> None:  # pragma: no cover - compiled
        for k in range(table.shape[0]):
            n = table[k, 3]
            sgd(base[table[k, 0]:table[k, 0] + n], base[table[k, 1]:table[k, 1] + n],
                base[table[k, 2]:table[k, 2] + n], lr, momentum, keep, weight_decay, nesterov,
                first)

    @jit
    def adam_multi(base: Any, table: Any, decay: Any, l2: Any, beta1: Any,
                   one_minus_beta1: Any, beta2: Any, one_minus_beta2: Any,
                   bias_correction2_sqrt: Any, eps: Any,
                   step_size: Any) -> None:  # pragma: no cover - compiled
        for k in range(table.shape[0]):
            n = table[k, 4]
            adam(base[table[k, 0]:table[k, 0] + n], base[table[k, 1]:table[k, 1] + n],
                 base[table[k, 2]:table[k, 2] + n], base[table[k, 3]:table[k, 3] + n], decay,
                 l2, beta1, one_minus_beta1, beta2, one_minus_beta2, bias_correction2_sqrt, eps,
                 step_size)

    return _Loops(sgd, adam, sgd_multi, adam_multi)


PARALLEL_LOOPS = _compile_loops(parallel=True)
SERIAL_LOOPS = _compile_loops(parallel=False)

PARALLEL_MIN_NUMEL = 1 << 18
"""Shorter arrays run on one thread (waking the pool costs more than the work)."""

THREADS_REQUESTED = "NUMBA_NUM_THREADS" in os.environ


def _loops(numel: int) -> _Loops:
    if THREADS_REQUESTED and numel >= PARALLEL_MIN_NUMEL and numba.get_num_threads() > 1:
        return PARALLEL_LOOPS
    return SERIAL_LOOPS


signature = optim_math.signature  # the fallback's per-signature rehearsal key


def check_usable() -> None:
    """Nothing to probe: importing Numba was the test (compiling happens on first use)."""


def sgd_step(p: np.ndarray, g: np.ndarray, buf: np.ndarray, lr: Any, momentum: Any, keep: Any,
             weight_decay: Any, nesterov: bool, first: bool) -> None:
    """One SGD step in place on 1-D arrays (``buf``: the momentum buffer, unread if momentum 0)."""
    loops = _loops(p.size)
    args = (p, g, buf, lr, momentum, keep, weight_decay, bool(nesterov), bool(first))
    if loops is PARALLEL_LOOPS:
        with _PARALLEL_LOCK:
            loops.sgd(*args)
    else:
        loops.sgd(*args)


def sgd_multi_step(base: np.ndarray, table: np.ndarray, max_numel: int, *scalars: Any) -> None:
    """One SGD step of every tensor in a multi-tensor table: ONE compiled call (``scalars`` as
    ``sgd_step``'s; row k of ``table``: offsets of p, g, buf in ``base``, numel)."""
    loops = _loops(int(max_numel))
    if loops is PARALLEL_LOOPS:
        with _PARALLEL_LOCK:
            loops.sgd_multi(base, table, *scalars)
    else:
        loops.sgd_multi(base, table, *scalars)


def adam_multi_step(base: np.ndarray, table: np.ndarray, max_numel: int, *scalars: Any) -> None:
    """One Adam/AdamW step of every tensor in a multi-tensor table (p, g, m, v, numel): ONE
    compiled call."""
    loops = _loops(int(max_numel))
    if loops is PARALLEL_LOOPS:
        with _PARALLEL_LOCK:
            loops.adam_multi(base, table, *scalars)
    else:
        loops.adam_multi(base, table, *scalars)


_MULTI_COLUMNS = {"sgd_multi_step": 3, "adam_multi_step": 4}


def rehearse(op: str, *args: Any) -> None:
    """Compile and run ``op`` on private data: small copies of the arrays, or for a
    multi-tensor op a small private table (a copy of the real one would point past it)."""
    columns = _MULTI_COLUMNS.get(op)
    if columns is None:
        globals()[op](*private_copies(args))
        return
    base, table = optim_math.rehearsal_table(np, args[0].dtype, columns, 67)
    globals()[op](base, table, 67, *args[3:])


def adam_step(p: np.ndarray, g: np.ndarray, m: np.ndarray, v: np.ndarray, *scalars: Any) -> None:
    """One Adam/AdamW step in place on 1-D arrays; ``scalars`` as ``optim_math.adam_element``."""
    loops = _loops(p.size)
    if loops is PARALLEL_LOOPS:
        with _PARALLEL_LOCK:
            loops.adam(p, g, m, v, *scalars)
    else:
        loops.adam(p, g, m, v, *scalars)
