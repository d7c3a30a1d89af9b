"""numba.cuda kernel of the CUDA-IPC all-reduce: one slice reduced from up to 8 device windows.

    from minidist.kernels import reduce_cuda
    reduce_cuda.reduce_slices(out, [win0[lo:hi], win1[lo:hi], ...], "sum")   # rank order
    launch = reduce_cuda.reduce_plan(out, [win0[lo:hi], ...], "sum")  # built once ...
    launch()                                                          # ... launched per call

Each rank of a node reduces ITS slice of the buffer by reading that slice in every rank's
window (peers' windows are mapped into this process with CUDA IPC), in one launch::

    out[i] = s0[i] (op) s1[i] (op) s2[i] ...        (rank order: identical bits on every rank)

``out`` may be one of the sources (each thread reads element i of all sources before writing
element i). The sources are up to ``MAX_SOURCES`` separate arguments (unused ones repeat s0
and are not read): kernels take a fixed argument list, and the windows are separate
allocations that no single array can span. Ops: sum (avg sums, the caller divides), prod,
max, min (max/min propagate NaN, as NumPy's ``maximum``/``minimum``).

Grid-stride loop on CuPy's current stream; ``@cuda.jit`` without a signature (compiles on first
use). ``reduce_plan`` goes through the launch plans of ``minidist.kernels.cuda``: the Numba
views and the configured launch are built once, and a later launch skips the dispatcher (the
all-reduce keeps one plan per window slice, so a call builds nothing). Tested under the
simulator (tests/cuda/train_kernels_cudasim_rank.py).
"""

from __future__ import annotations

from typing import Any, Callable, no_type_check

import numpy as np

from minidist.kernels import cuda as kcuda
from minidist.kernels.cuda import cuda
from minidist.kernels.fallback import private_copies

__all__ = ["reduce_slices", "reduce_plan", "MAX_SOURCES", "OP_CODES", "check_usable",
           "signature", "rehearse"]

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
    """Raise unless kernels can run on CuPy arrays here (``kernels.cuda.check_usable``)."""
    kcuda.check_usable()


def signature(op: str, out: Any, sources: list[Any], *rest: Any) -> tuple:
    """What selects a compiled specialization (for ``minidist.kernels.fallback``)."""
    return op, type(out), out.dtype.char


def reduce_plan(out: Any, sources: list[Any], op: str, *,
                launch: tuple[int, int] | None = None) -> Callable[[], None]:
    """A callable that launches ``out = sources[0] (op) sources[1] (op) ...`` (2..8 sources)
    on the stream current now; the views and the configured launch are built here, once."""
    n = len(sources)
    if not 2 <= n <= MAX_SOURCES:
        raise ValueError(f"reduce_slices: {n} sources; the kernel takes 2 to {MAX_SOURCES}.")
    if out.size == 0:
        return lambda: None
    arrays = (out, *sources, *[sources[0]] * (MAX_SOURCES - n))
    plan = kcuda.launch_plan(_reduce_kernel, arrays, int(out.size), launch)
    views = _in_place(plan.views)
    args = (views[0], np.int64(n), np.int64(OP_CODES[op]), *views[1:])
    return lambda: plan.launch(*args)


def _in_place(views: tuple[Any, ...]) -> tuple[Any, ...]:
    """The simulator copies each NumPy argument in and back out around a launch, so an output
    that is also a source would be overwritten by that source's copy-back: there, wrap the
    arrays in the simulator's device-array type (no copies), as a GPU's views are."""
    if not kcuda.SIMULATOR:
        return views
    fake = type(cuda.to_device(np.zeros(1, np.uint8)))
    return tuple(fake(v) if isinstance(v, np.ndarray) else v for v in views)


def reduce_slices(out: Any, sources: list[Any], op: str, *,
                  launch: tuple[int, int] | None = None) -> None:
    """``out = sources[0] (op) sources[1] (op) ...`` elementwise, one launch (2..8 sources)."""
    reduce_plan(out, sources, op, launch=launch)()


def rehearse(op: str, *args: Any) -> None:
    """Compile and launch ``op`` on small private copies and wait (``kernels.fallback``)."""
    copies = private_copies(args)
    for _ in range(2):
        if op == "reduce_plan":
            reduce_plan(*copies)()
        else:
            globals()[op](*copies)
    if not kcuda.SIMULATOR:
        import cupy

        cupy.cuda.get_current_stream().synchronize()
