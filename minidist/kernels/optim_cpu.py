"""Numba CPU kernels for the fused optimizer steps, built from each entry's element function.

    from minidist.kernels import optim_cpu     # imports numba; minidist.optim.fused does it lazily
    optim_cpu.flat_step(entry, p, g, (buf,), scalars)          # one flat run: p, g, its state
    optim_cpu.multi_step(entry, base, table, max_numel, scalars)   # a multi-tensor table

``entry`` is a ``minidist.optim.registry.FusedStep``; its loops are compiled on first use (per
entry, serial and parallel) from ``entry.element``, and cached. Arrays are 1-D, C-contiguous,
of one dtype (float32 or float64); scalars have that dtype (flags are bools);
``minidist.optim.fused`` checks and prepares them. Why one pass: the per-parameter NumPy step
of AdamW makes 14 whole-array passes (each reads one or two arrays and writes one), about 100
bytes of memory traffic per parameter; this loop reads p, g, m, v once and writes p, m, v once
(28 bytes for float32)::

    NumPy (optim/adam.py)                     this module (optim_math.make_update, inlined)
    p *= 1 - lr*wd          read p, write p   for i in range(n):
    m *= b1; b = g*(1-b1)   ...                   new = element(p[i], g[i], m[i], v[i], ...)
    m += b; v *= b2; ...    (14 passes,           m[i], v[i] = new[1], new[2]
    a = sqrt(v); a /= ...    2 temporaries)       p[i] = new[0]

The element runs inlined, in its own order of operations: the results are the same bits as
the same function on whole NumPy arrays (tests/optim/test_fused_optim.py). The loop vectorizes
(AVX) because of two settings: ``error_model="numpy"`` (Python's error model checks every
division for zero and raises, a branch that stops vectorization; NumPy's gives IEEE inf/NaN,
as the NumPy path does) and no ``fastmath`` (which would let LLVM reassociate, and change bits).

Threads: as ``kernels/cpu.py``, ``prange`` only when ``NUMBA_NUM_THREADS`` is set and the array
is long (``PARALLEL_MIN_NUMEL``); otherwise one thread.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any, NamedTuple

import numba
import numpy as np
from numba import njit, prange
from numba.core.errors import NumbaError
from numba.extending import overload

from minidist.kernels import jit_cache, optim_math
from minidist.kernels.fallback import private_copies

__all__ = ["flat_step", "multi_step", "loops_for", "COMPILE_ERRORS", "check_usable",
           "signature", "rehearse", "compile_guard"]

COMPILE_ERRORS: tuple[type[BaseException], ...] = (NumbaError,)
"""Errors that mean "Numba cannot compile this here" (the caller falls back to NumPy)."""

@overload(optim_math.sqrt, target="cpu", inline="always")
def _sqrt(x: Any) -> Any:
    def impl(x: Any) -> Any:
        return np.sqrt(x)
    return impl


# Numba's workqueue threading layer aborts when two Python threads run parallel kernels at once.
_PARALLEL_LOCK = threading.Lock()


class Loops(NamedTuple):
    """An entry's compiled loops: ``flat(p, g, states, scalars)`` over one flat run and
    ``multi(base, table, scalars)`` over every row of a multi-tensor table."""

    flat: Any
    multi: Any


def _compile_loops(entry: Any, parallel: bool) -> Loops:
    """Both loops of ``entry``, from its element function, with ``prange`` or ``range``: from
    the module ``jit_cache`` writes for it (compiled once per machine, then loaded from Numba's
    disk cache), else built here in memory (compiled in every process)."""
    cached = jit_cache.loops_module(entry.element, len(entry.state))
    if cached is not None:
        return (Loops(cached.flat_parallel, cached.multi_parallel) if parallel
                else Loops(cached.flat, cached.multi))
    loop_range = prange if parallel else range
    jit = njit(parallel=parallel, error_model="numpy")
    element = njit(error_model="numpy")(entry.element)
    update = njit(error_model="numpy")(optim_math.make_update(element, len(entry.state)))
    columns = njit(optim_math.make_columns(len(entry.state)))

    @jit
    def flat(p: Any, g: Any, states: Any, scalars: Any) -> None:  # pragma: no cover - compiled
        for i in loop_range(p.size):
            update(i, p, g, states, scalars)

    # Multi-tensor: every tensor of a (dtype) group in one call. ``base`` spans them all and
    # row k of ``table`` holds tensor k's element offsets in it, then its numel (multi_tensor).
    # Each tensor's columns are cut out of ``base`` as slices and run through the loop above:
    # indexing ``base[offset + j]`` directly would make Numba check each index for
    # wraparound (it cannot prove offset + j >= 0), which stops the loop vectorizing (~7x).
    @jit
    def multi(base: Any, table: Any, scalars: Any) -> None:  # pragma: no cover - compiled
        for k in range(table.shape[0]):
            p, g, states = columns(base, table[k], table[k, table.shape[1] - 1])
            flat(p, g, states, scalars)

    return Loops(flat, multi)


_LOOPS: dict[tuple[Any, bool], Loops] = {}
_COMPILE_LOCK = threading.Lock()


def loops_for(entry: Any, parallel: bool = False) -> Loops:
    """``entry``'s loops (built once per entry and variant; Numba compiles them on first call
    for the argument types)."""
    loops = _LOOPS.get((entry, parallel))
    if loops is None:
        with _COMPILE_LOCK:
            loops = _LOOPS.get((entry, parallel))
            if loops is None:
                loops = _LOOPS[(entry, parallel)] = _compile_loops(entry, parallel)
    return loops


PARALLEL_MIN_NUMEL = 1 << 18
"""Shorter arrays run on one thread (waking the pool costs more than the work)."""

THREADS_REQUESTED = "NUMBA_NUM_THREADS" in os.environ


def _parallel(numel: int) -> bool:
    return THREADS_REQUESTED and numel >= PARALLEL_MIN_NUMEL and numba.get_num_threads() > 1


signature = optim_math.signature  # the fallback's per-signature rehearsal key
jit_cache.watch_compiles()


def compile_guard(op: str, entry: Any, *args: Any) -> Any:
    """The context the fallback rehearses (compiles) ``op`` in: ``jit_cache.compile_guard``
    for loops cached on disk (one process of the machine compiles at a time), else none."""
    module = jit_cache.loops_module(entry.element, len(entry.state))
    if module is None:
        return contextlib.nullcontext()
    parallel = _parallel(args[0].size if op == "flat_step" else int(args[2]))
    variant = "parallel" if parallel else "serial"
    return jit_cache.compile_guard(str(module.__file__), f"{op}-{variant}-{args[0].dtype.char}")


def check_usable() -> None:
    """Nothing to probe: importing Numba was the test (compiling happens on first use)."""


def flat_step(entry: Any, p: np.ndarray, g: np.ndarray, states: tuple[np.ndarray, ...],
              scalars: tuple[Any, ...], parallel: bool | None = None) -> None:
    """One step of ``entry`` in place on one flat run (1-D arrays: the parameters, their
    gradients, and one array per state name); ``parallel``: the variant (default: by size)."""
    if _parallel(p.size) if parallel is None else parallel:
        with _PARALLEL_LOCK:
            loops_for(entry, True).flat(p, g, states, scalars)
    else:
        loops_for(entry).flat(p, g, states, scalars)


def multi_step(entry: Any, base: np.ndarray, table: np.ndarray, max_numel: int,
               scalars: tuple[Any, ...], parallel: bool | None = None) -> None:
    """One step of ``entry`` for every tensor of a multi-tensor table: ONE compiled call (row
    k of ``table``: offsets of p, g and each state array in ``base``, then the numel)."""
    if _parallel(int(max_numel)) if parallel is None else parallel:
        with _PARALLEL_LOCK:
            loops_for(entry, True).multi(base, table, scalars)
    else:
        loops_for(entry).multi(base, table, scalars)


def rehearse(op: str, entry: Any, *args: Any) -> None:
    """Compile and run ``op`` on private data: small copies of the arrays, or for a
    multi-tensor op a small private table (a copy of the real one would point past it), in
    the variant (threads or not) that the real call will run."""
    if op == "flat_step":
        p, g, states, scalars = private_copies(args)
        flat_step(entry, p, g, states, scalars, parallel=_parallel(args[0].size))
        return
    base, table = optim_math.rehearsal_table(np, args[0].dtype, 2 + len(entry.state), 67)
    multi_step(entry, base, table, 67, args[3], parallel=_parallel(int(args[2])))
