"""numba.cuda kernel of the CUDA-IPC all-reduce: one slice reduced from up to 8 device windows.

    from minidist.kernels import reduce_cuda
    reduce_cuda.reduce_slices(out, [win0[lo:hi], win1[lo:hi], ...], "sum")   # rank order

Each rank of a node reduces ITS slice of the buffer by reading that slice in every rank's
window (peers' windows are mapped into this process with CUDA IPC), in one launch::

    out[i] = s0[i] (op) s1[i] (op) s2[i] ...        (rank order: identical bits on every rank)

``out`` may be one of the sources (each thread reads element i of all sources before writing
element i). The sources are up to ``MAX_SOURCES`` separate arguments (unused ones repeat s0
and are not read): kernels take a fixed argument list, and the windows are separate
allocations that no single array can span. Ops: sum (avg sums, the caller divides), prod,
max, min (max/min propagate NaN, as NumPy's ``maximum``/``minimum``).

Grid-stride loop on CuPy's current stream; ``@cuda.jit`` without a signature (compiles on first
use). Tested under the simulator (tests/cuda/train_kernels_cudasim_body.py).
"""

from __future__ import annotations

from typing import Any, no_type_check

from numba import cuda

from minidist.kernels import optim_cuda

__all__ = ["reduce_slices", "MAX_SOURCES", "OP_CODES", "check_usable", "signature"]

MAX_SOURCES = 8
OP_CODES = {"sum": 0, "avg": 0, "prod": 1, "max": 2, "min": 3}


@cuda.jit(device=True)
@no_type_check
def _combine(a, b, op):
    if op == 0:
        return a + b
    if op == 1:
        return a * b
    if a != a:  # NaN propagates, as np.maximum / np.minimum
        return a
    if b != b:
        return b
    if op == 2:
        return a if a >= b else b
    return a if a <= b else b


@cuda.jit
@no_type_check
def _reduce_kernel(out, n, op, s0, s1, s2, s3, s4, s5, s6, s7):
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, out.size, stride):
        acc = _combine(s0[i], s1[i], op)
        if n > 2:
            acc = _combine(acc, s2[i], op)
        if n > 3:
            acc = _combine(acc, s3[i], op)
        if n > 4:
            acc = _combine(acc, s4[i], op)
        if n > 5:
            acc = _combine(acc, s5[i], op)
        if n > 6:
            acc = _combine(acc, s6[i], op)
        if n > 7:
            acc = _combine(acc, s7[i], op)
        out[i] = acc


def check_usable() -> None:
    """Raise unless kernels can run on CuPy arrays here (``optim_cuda.check_usable``)."""
    optim_cuda.check_usable()


def signature(op: str, out: Any, sources: list[Any], *rest: Any) -> tuple:
    """What selects a compiled specialization (for ``minidist.kernels.fallback``)."""
    return op, type(out), out.dtype.char


def reduce_slices(out: Any, sources: list[Any], op: str, *,
                  launch: tuple[int, int] | None = None) -> None:
    """``out = sources[0] (op) sources[1] (op) ...`` elementwise, one launch (2..8 sources)."""
    n = len(sources)
    if not 2 <= n <= MAX_SOURCES:
        raise ValueError(f"reduce_slices: {n} sources; the kernel takes 2 to {MAX_SOURCES}.")
    if out.size == 0:
        return
    views = [optim_cuda.device_view(s) for s in sources]
    views += [views[0]] * (MAX_SOURCES - n)
    blocks, threads = optim_cuda.launch_config(int(out.size), launch)
    optim_cuda.configured(_reduce_kernel, blocks, threads)(optim_cuda.device_view(out), n,
                                                          OP_CODES[op], *views)
