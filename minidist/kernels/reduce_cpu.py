"""Numba CPU kernel of the shared-memory all-reduce: a slice summed from every rank's buffer,
written back to all of them and checked for NaN/inf, in one pass.

    from minidist.kernels import reduce_cpu
    finite = reduce_cpu.sum_to_all((mine[lo:hi], peer[lo:hi]), 2)   # the AVG of 2 ranks

Each rank of a node owns one slice of the buffer and reads that slice in every rank's buffer
(fastpath/shm.py maps them all into this process). Per element, in rank order::

    v = b0[i] + b1[i] + b2[i] ...      read each rank's element once (the same bits everywhere)
    v = v / divisor                    AVG: the ranks' count; SUM: 1 (exact)
    bad |= (v - v) != 0                inf - inf and NaN - NaN are NaN; a finite v gives 0
    b0[i] = b1[i] = ... = v            written back to every rank's buffer

One read and one write of each buffer's slice: NumPy needs an add per extra rank, the divide,
a check and a copy per peer, each a pass of its own (fastpath/shm.py does them piece by piece
in cache, and is this kernel's reference: the same bits, the verdict exact here and a fast
"maybe" there). ``(v - v) != 0`` is an exact NaN/inf test that vectorizes (an integer OR);
no ``fastmath``, which would let LLVM fold it away.

The buffers come as a tuple (Numba compiles one loop per count and dtype, float32 or float64),
every one C-contiguous and of one size; the caller checks. ``nogil``: DDP's comm thread reduces
while the main thread runs backward. ``cache=True``, and the ranks of a job take turns
compiling (``compile_guard``, kernels/jit_cache.py), as the AMP kernels of cpu.py.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
from numba import njit

from minidist.kernels import jit_cache
from minidist.kernels.fallback import default_signature

__all__ = ["sum_to_all", "check_usable", "compile_guard"]

jit_cache.watch_compiles()


@njit(cache=True, nogil=True, error_model="numpy")
def _sum_to_all(bufs: Any, divisor: Any) -> bool:  # pragma: no cover (compiled)
    bad = False
    first = bufs[0]
    for i in range(first.size):
        v = first[i]
        for j in range(1, len(bufs)):
            v += bufs[j][i]
        v = v / divisor
        bad |= (v - v) != 0
        for j in range(len(bufs)):
            bufs[j][i] = v
    return not bad


def sum_to_all(bufs: tuple[np.ndarray, ...], divisor: int) -> bool:
    """Every buffer of ``bufs`` becomes ``(bufs[0] + bufs[1] + ...) / divisor``; True if the
    result holds no NaN/inf (exact). Two or more 1-D C-contiguous float32 or float64 arrays of
    one size and dtype, distinct (not overlapping)."""
    return bool(_sum_to_all(bufs, bufs[0].dtype.type(divisor)))


def check_usable() -> None:
    """Nothing to probe: importing Numba was the test (compiling happens on first use)."""


def compile_guard(op: str, *args: Any) -> Any:
    """One process of the machine compiles a signature at a time (kernels/jit_cache.py)."""
    key = hashlib.sha256(repr(default_signature(op, args)).encode()).hexdigest()[:10]
    return jit_cache.compile_guard(__file__, f"{op}-{key}")
