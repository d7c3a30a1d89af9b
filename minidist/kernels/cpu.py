"""Numba CPU kernels for mixed precision: each fused op reads its input once.

    from minidist.kernels import cpu        # imports numba (slow); minidist.kernels does it lazily
    found = cpu.unscale_and_check(grads32, grads32, 1 / 65536)    # fp32 in place
    found = cpu.unscale_and_check(grads16, master32, 1 / 65536)   # fp16 grads -> fp32 master

Arguments are checked by ``minidist.kernels`` before they get here (dtypes, sizes, contiguity);
call these through ``minidist.kernels`` unless you have validated them yourself.

Why one pass. NumPy (``reference.py``) needs two passes over the gradients plus a temporary:

    two passes (NumPy)                                one pass (this module)
    ------------------                                ----------------------
    tmp = isfinite(src)   read src, write tmp         for i in prange(n):     (threads split n)
    found = ~tmp.all()    read tmp                        h = src[i]          read once
    dst = src * inv       read src again, write dst       v = decode(h)       fp16 bits -> fp32
                                                          bad = not finite(v) check the INPUT
                                                          dst[i] = v * inv    fp32 multiply, store
                                                      found = any(bad)    (a prange reduction)

Per element that is 14 bytes of memory traffic against 8 (fp32 in place) or 10 against 6
(fp16 -> fp32): the fused kernel runs at memory speed while NumPy streams the array twice, and
NumPy's own float16 arithmetic is slow (it converts element by element in software).

Each loop is compiled twice from one source: with ``prange`` (Numba's thread pool, up to
``numba.get_num_threads()`` threads) for arrays of ``PARALLEL_MIN_NUMEL`` elements and more,
and as a plain loop for shorter ones, where waking the pool would cost more than the work.
The pool is used only when ``NUMBA_NUM_THREADS`` is set in the environment (the user chose a
thread count): the loops are memory-bound, so a second thread gains little on an idle machine
(docs/benchmarks.md), while Numba's default of one thread per core, in processes that already
share the cores (MPI ranks, other jobs), makes every call wait for threads that have no core
to run on: many times slower than one thread (``benchmarks/amp_kernels.py`` measures both).

Numba has no float16 on the CPU (any float16 array raises ``NotImplementedError``), so fp16
arrays come in as ``.view(np.uint16)`` and are converted with integer code here, branch-free so
the loops vectorize: decoding is exact, and encoding (``master_to_model``) rounds to nearest
even with NumPy's NaN rule; it gave NumPy's ``astype(np.float16)`` bits for all 2^32 float32
inputs (``MINIDIST_EXHAUSTIVE=1`` in tests/kernels/test_kernels.py).

No ``fastmath``: it lets LLVM assume there are no inf/NaN, and ``isfinite`` then folds to True
(the check silently disappears). ``cache=True`` stores the machine code next to this file (or,
where this folder is read-only, in Numba's user-wide cache folder), so a second process (every
MPI rank, every later run) loads it instead of compiling; the ranks of a job take turns
compiling (``compile_guard``, kernels/jit_cache.py).

The element logic is ``reference.unscale_element`` / ``reference.update_scale_rule``, compiled
here with ``njit(inline="always")``: one definition for NumPy, CPU and CUDA.
"""

from __future__ import annotations

import hashlib
import os
import threading
from typing import Any, NamedTuple

import numba
import numpy as np
from numba import njit, prange

from minidist.kernels import jit_cache, reference
from minidist.kernels.fallback import default_signature, private_copies

__all__ = ["unscale_and_check", "unscale_and_check_", "foreach_unscale_and_check_",
           "update_scale_", "master_to_model", "check_usable", "signature", "rehearse"]

jit_cache.watch_compiles()  # counted, and said once (rank 0, INFO)
_unscale_element = njit(inline="always")(reference.unscale_element)
_update_scale_rule = njit(inline="always")(reference.update_scale_rule)

# Numba's default "workqueue" threading layer aborts the process when two Python threads run
# parallel kernels at the same time (the threads transport runs ranks as threads). The kernels
# are memory bound, so taking turns costs little.
_PARALLEL_LOCK = threading.Lock()

_TWO_POW_112 = np.float32(2.0 ** 112)  # rebias: float32 exponent bias 127 - float16 bias 15


# ----------------------------------------------------------------- float16 <-> float32 bits

@njit(inline="always")
def half_to_float(h: Any) -> Any:
    """float16 bits (uint16) -> the float32 value, exactly as NumPy's float16 -> float32 cast.

    The 15 bits below the sign are moved up 13 places into float32's exponent/mantissa slots;
    that float32 is the fp16 value times 2^-112 (for subnormals too), so one exact multiply by
    2^112 rebiases it. Exponent 31 (inf/NaN) instead gets float32's all-ones exponent 255.
    """
    bits = np.uint32(h)
    magnitude = np.uint32((bits & np.uint32(0x7FFF)) << np.uint32(13))
    if magnitude >= np.uint32(0x0F800000):  # fp16 exponent 31: inf or NaN (payload kept)
        out = np.uint32(magnitude | np.uint32(0x7F800000))
    else:  # zero, subnormal or normal
        rebiased = np.uint32(magnitude).view(np.float32) * _TWO_POW_112
        out = np.float32(rebiased).view(np.uint32)
    sign = np.uint32((bits & np.uint32(0x8000)) << np.uint32(16))
    return np.uint32(out | sign).view(np.float32)


@njit(inline="always")
def float_to_half_bits(f: Any) -> Any:
    """float32 bits (uint32) -> float16 bits, round to nearest even, as NumPy's astype.

    Three candidates, then a select (no branches, so the loop vectorizes):

        |f| < 2^-14   subnormal/zero: float(|f|) + 0.5 puts the 10 fp16 mantissa bits at the
                      bottom of the float32 mantissa, rounded to nearest even by the FPU;
                      subtracting 0.5's bits leaves the fp16 bits
        |f| < 2^16    normal: rebias the exponent (-112 << 23), add 0xFFF + the lowest kept bit
                      (ties go to even), shift 13 places; a carry bumps the exponent, from
                      65520 up to 0x7C00 = inf
        otherwise     inf (or overflow to inf); NaN keeps its top 10 payload bits and stays NaN
                      (0x7C01 if they were all zero), as NumPy's ``npy_floatbits_to_halfbits``
    """
    f = np.uint32(f)
    a = np.uint32(f & np.uint32(0x7FFFFFFF))
    sign = np.uint32((f >> np.uint32(16)) & np.uint32(0x8000))
    aligned = np.uint32(a).view(np.float32) + np.float32(0.5)
    subnormal = np.uint32(np.float32(aligned).view(np.uint32) - np.uint32(0x3F000000))
    odd = np.uint32((a >> np.uint32(13)) & np.uint32(1))
    normal = np.uint32((a - np.uint32(0x38000000) + np.uint32(0xFFF) + odd) >> np.uint32(13))
    payload = np.uint32((a & np.uint32(0x007FFFFF)) >> np.uint32(13))
    nan = np.uint32(0x7C00) + (payload if payload != np.uint32(0) else np.uint32(1))
    h = subnormal if a < np.uint32(0x38800000) else normal
    h = np.uint32(0x7C00) if a >= np.uint32(0x47800000) else h
    h = nan if a > np.uint32(0x7F800000) else h
    return np.uint16(np.uint32(h) | sign)


# ----------------------------------------------------------------- kernels

class _Loops(NamedTuple):
    unscale_f32_inplace: Any
    unscale_f32: Any
    unscale_f16: Any
    to_half: Any


def _compile_loops(parallel: bool) -> _Loops:
    """The elementwise loops, compiled lazily with ``prange`` (threads) or a plain ``range``.

    Both variants come from this one source. ``loop_range`` is a closure variable on purpose:
    Numba's cache keys a function by its name, bytecode and closure values (not by its flags),
    so the closure is what keeps the two variants' cache entries apart.
    """
    loop_range = prange if parallel else range
    jit = njit(parallel=parallel, cache=True)

    @jit
    def unscale_f32_inplace(grads: Any, inv_scale: Any) -> bool:  # pragma: no cover
        found = 0
        for i in loop_range(grads.size):
            value, bad = _unscale_element(grads[i], inv_scale)
            grads[i] = value
            found += bad
        return found > 0

    # A separate loop for dst is src: with two array arguments LLVM guards its vector loop with
    # a runtime overlap test that equal pointers fail, and in place ran scalar (slower).
    @jit
    def unscale_f32(src: Any, dst: Any, inv_scale: Any) -> bool:  # pragma: no cover
        found = 0
        for i in loop_range(src.size):
            value, bad = _unscale_element(src[i], inv_scale)
            dst[i] = value
            found += bad
        return found > 0

    @jit
    def unscale_f16(src_bits: Any, dst: Any, inv_scale: Any) -> bool:  # pragma: no cover
        found = 0
        for i in loop_range(src_bits.size):
            value, bad = _unscale_element(half_to_float(src_bits[i]), inv_scale)
            dst[i] = value
            found += bad
        return found > 0

    @jit
    def to_half(master_bits: Any, model_bits: Any) -> None:  # pragma: no cover
        for i in loop_range(master_bits.size):
            model_bits[i] = float_to_half_bits(master_bits[i])

    return _Loops(unscale_f32_inplace, unscale_f32, unscale_f16, to_half)


PARALLEL_LOOPS = _compile_loops(parallel=True)
SERIAL_LOOPS = _compile_loops(parallel=False)

PARALLEL_MIN_NUMEL = 1 << 18
"""Arrays shorter than this run on one thread: below it, one core finishes the loop in about
the time that waking the other threads costs on a busy machine (``benchmarks/amp_kernels.py``
times both)."""


THREADS_REQUESTED = "NUMBA_NUM_THREADS" in os.environ
"""Whether the user chose Numba's thread count; without it every kernel runs on one thread."""


def _loops(numel: int) -> _Loops:
    if THREADS_REQUESTED and numel >= PARALLEL_MIN_NUMEL and numba.get_num_threads() > 1:
        return PARALLEL_LOOPS
    return SERIAL_LOOPS


@njit(cache=True)
def _update_scale(scale: Any, growth_tracker: Any, found_inf: Any, growth_factor: float,
                  backoff_factor: float, growth_interval: int) -> None:  # pragma: no cover
    found = np.float32(0.0)
    for k in range(found_inf.size):  # any slot set (NaN counts: it is != 0)
        if found_inf[k] != 0.0:
            found = np.float32(1.0)
        found_inf[k] = 0.0           # reset for the next step
    new_scale, new_tracker = _update_scale_rule(scale[0], growth_tracker[0], found,
                                                growth_factor, backoff_factor, growth_interval)
    scale[0] = new_scale
    growth_tracker[0] = new_tracker


# ----------------------------------------------------------------- entry points

def check_usable() -> None:
    """Nothing to probe: importing Numba was the test (compiling happens on first use)."""


def _numel(args: tuple[Any, ...]) -> int:
    first = args[0]
    if isinstance(first, (list, tuple)):
        return max((int(a.size) for a in first), default=0)
    return int(first.size)


def signature(op: str, *args: Any) -> Any:
    """What selects compiled code: the op, dtypes, aliasing, and serial vs prange loops."""
    return (default_signature(op, args), _loops(_numel(args)) is PARALLEL_LOOPS)


def compile_guard(op: str, *args: Any) -> Any:
    """The context the fallback rehearses (compiles) ``op`` in: one process of the machine
    compiles a signature at a time, the others load it from Numba's cache (jit_cache.py)."""
    key = hashlib.sha256(repr(signature(op, *args)).encode()).hexdigest()[:10]
    return jit_cache.compile_guard(__file__, f"{op}-{key}")


def rehearse(op: str, *args: Any) -> None:
    """Compile and run ``op`` on small private copies, with the loops the real call will use
    (the prange variant compiles separately), before any caller data is touched."""
    loops = _loops(_numel(args))
    copies = private_copies(args)
    if op == "update_scale_":
        update_scale_(*copies)
    elif op == "master_to_model":
        _to_half(loops, *copies)
    elif op == "foreach_unscale_and_check_":
        srcs, dsts, inv, found = copies
        for s, d in zip(srcs, dsts):
            _unscale(loops, s, d, inv)
    else:  # unscale_and_check(_)
        _unscale(loops, copies[0], copies[1], copies[2])


def _run(loops: _Loops, kernel: Any, *args: Any) -> Any:
    if loops is PARALLEL_LOOPS:
        with _PARALLEL_LOCK:
            return kernel(*args)
    return kernel(*args)


def _unscale(loops: _Loops, src: np.ndarray, dst: np.ndarray, inv_scale: Any) -> bool:
    inv = np.float32(inv_scale)
    flat_src, flat_dst = src.reshape(-1), dst.reshape(-1)
    if flat_src.dtype == np.float16:
        return bool(_run(loops, loops.unscale_f16, flat_src.view(np.uint16), flat_dst, inv))
    if src is dst or np.may_share_memory(src, dst):  # validated: overlap means the same buffer
        return bool(_run(loops, loops.unscale_f32_inplace, flat_dst, inv))
    return bool(_run(loops, loops.unscale_f32, flat_src, flat_dst, inv))


def _to_half(loops: _Loops, master: np.ndarray, model: np.ndarray) -> None:
    _run(loops, loops.to_half, master.reshape(-1).view(np.uint32),
         model.reshape(-1).view(np.uint16))


def unscale_and_check(src: np.ndarray, dst: np.ndarray, inv_scale: float) -> bool:
    """``dst = float32(src) * inv_scale`` in one pass; True if ``src`` holds a NaN or an inf.

    Args:
        src: C-contiguous float32 or float16 array (the scaled gradients).
        dst: C-contiguous float32 array with as many elements; may be ``src`` (float32).
        inv_scale: 1 / scale as a host number; it is rounded to float32 first, as NumPy does.
    """
    return _unscale(_loops(int(src.size)), src, dst, inv_scale)


def unscale_and_check_(src: np.ndarray, dst: np.ndarray, inv_scale: float,
                       found_inf: np.ndarray) -> None:
    """:func:`unscale_and_check`, then ``found_inf[0] = 1.0`` if it found a NaN/inf (never 0)."""
    if unscale_and_check(src, dst, inv_scale):
        found_inf[0] = 1.0


def foreach_unscale_and_check_(srcs: list[np.ndarray], dsts: list[np.ndarray],
                               inv_scale: float, found_inf: np.ndarray) -> None:
    """:func:`unscale_and_check_` over pairs of buffers (on the CPU a loop over the pairs)."""
    bad = False
    inv = np.float32(inv_scale)
    for src, dst in zip(srcs, dsts):
        bad |= _unscale(_loops(src.size), src, dst, inv)
    if bad:
        found_inf[0] = 1.0


def update_scale_(scale: np.ndarray, growth_tracker: np.ndarray, found_inf: np.ndarray,
                  growth_factor: float, backoff_factor: float, growth_interval: int) -> None:
    """torch's ``_amp_update_scale_`` in place on float32[1], int32[1], float32[k] arrays; then
    ``found_inf[:] = 0`` for the next step."""
    _update_scale(scale, growth_tracker, found_inf.reshape(-1), float(growth_factor),
                  float(backoff_factor), int(growth_interval))


def master_to_model(master: np.ndarray, model: np.ndarray) -> None:
    """``model[...] = master.astype(float16)`` (round to nearest even), in place, one pass."""
    _to_half(_loops(int(master.size)), master, model)
