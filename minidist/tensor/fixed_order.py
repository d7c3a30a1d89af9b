"""Fixed-order kernels: ``matmul``, ``exp`` and ``log`` whose bits do not depend on the machine.

A BLAS picks its GEMM kernel by CPU (``OPENBLAS_CORETYPE``: Haswell, SkylakeX, Zen ...) and each
kernel adds the products of a dot product in its own order and with or without FMA; NumPy picks
its ``exp``/``log`` loops by SIMD level (AVX-512, AVX2, or the C library's scalar code), and they
differ in the last bit. Each difference is one rounding; fifty epochs grow it into another final
accuracy. These kernels fix every rounding:

    matmul   out[i, j] = round( sum_k  a[i, k] * b[k, j] )     k = 0, 1, 2, ... in this order
                              '--------- in float64 --------'
             a float32 product is exact in float64; the sum runs in k order, one rounding to
             the output dtype at the end. Vectorizing over j (independent outputs) keeps the
             order of every output's sum, so AVX-512, AVX2 and SSE give the same bits.

    exp, log  range reduction and a fixed polynomial in float64 using only + - * / (each
              correctly rounded by IEEE 754 on every CPU) and exact scalings by powers of two,
              then one rounding to the input's dtype: no C library, no SIMD dispatch.

Numba compiles them without ``fastmath`` (no reassociation, no FMA contraction), on first use
(``use_deterministic_algorithms(True)``), cached on disk. They are slower than BLAS; the cost on
the main job is measured by ``benchmarks/deterministic.py``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy
from numba import njit

_LN2_HI = 6.93147180369123816490e-01  # ln 2 split in two: k * _LN2_HI is exact for |k| < 2**11
_LN2_LO = 1.90821492927058770002e-10
_INV_LN2 = 1.44269504088896338700e+00
_SQRT_HALF = 0.70710678118654752440

# 1/n! for n = 0..13: exp(r) for |r| <= ln(2)/2 to well below float64's precision
_EXP_COEF = tuple(1.0 / math.factorial(n) for n in range(14))
# 1/(2n+1) for n = 0..11: log(m) = 2 atanh(s), s = (m-1)/(m+1), |s| <= 0.1716
_LOG_COEF = tuple(1.0 / (2 * n + 1) for n in range(12))


@njit(cache=True)
def exp_scalar(x: float) -> float:
    """``e ** x`` in float64: x = k ln2 + r, exp(r) by Horner, times 2**k."""
    if x != x:
        return x
    if x > 709.782712893384:
        return math.inf
    if x < -745.1332191019412:
        return 0.0
    k = math.floor(x * _INV_LN2 + 0.5)
    r = (x - k * _LN2_HI) - k * _LN2_LO
    p = _EXP_COEF[13]
    for n in range(12, -1, -1):
        p = p * r + _EXP_COEF[n]
    return math.ldexp(p, int(k))


@njit(cache=True)
def log_scalar(x: float) -> float:
    """Natural log in float64: x = m 2**e with m in [sqrt(1/2), sqrt(2)), log m = 2 atanh(s)."""
    if x != x or x < 0.0:
        return math.nan
    if x == 0.0:
        return -math.inf
    if x == math.inf:
        return x
    m, e = math.frexp(x)
    if m < _SQRT_HALF:
        m *= 2.0
        e -= 1
    s = (m - 1.0) / (m + 1.0)
    s2 = s * s
    p = _LOG_COEF[11]
    for n in range(10, -1, -1):
        p = p * s2 + _LOG_COEF[n]
    return e * _LN2_HI + (e * _LN2_LO + 2.0 * s * p)


@njit(cache=True)
def _exp_into(x: Any, out: Any) -> None:
    for i in range(x.size):
        out[i] = exp_scalar(float(x[i]))


@njit(cache=True)
def _log_into(x: Any, out: Any) -> None:
    for i in range(x.size):
        out[i] = log_scalar(float(x[i]))


@njit(cache=True)
def _matmul_into(a: Any, b: Any, out: Any) -> None:
    n, k_len = a.shape
    m = b.shape[1]
    acc = numpy.empty(m, numpy.float64)
    for i in range(n):
        acc[:] = 0.0
        for k in range(k_len):
            aik = numpy.float64(a[i, k])
            for j in range(m):  # independent outputs: vectorized without changing any sum
                acc[j] += aik * numpy.float64(b[k, j])
        for j in range(m):
            out[i, j] = acc[j]


def _unary(kernel: Any, x: Any, out: Any) -> Any:
    x = numpy.asarray(x)
    if not numpy.issubdtype(x.dtype, numpy.floating):
        x = x.astype(numpy.float64)
    res = numpy.empty(x.shape, x.dtype) if out is None else out
    flat = numpy.ascontiguousarray(x).reshape(-1)
    if res.flags.c_contiguous:
        kernel(flat, res.reshape(-1))
    else:
        tmp = numpy.empty(x.shape, x.dtype)
        kernel(flat, tmp.reshape(-1))
        res[...] = tmp
    return res


def exp(x: Any, out: Any = None) -> Any:
    """``numpy.exp`` with the same bits on every machine (float16/32 inputs are exact to within
    one rounding of the float64 result)."""
    return _unary(_exp_into, x, out)


def log(x: Any, out: Any = None) -> Any:
    """``numpy.log`` with the same bits on every machine."""
    return _unary(_log_into, x, out)


def matmul(a: Any, b: Any, out: Any = None) -> Any:
    """``numpy.matmul`` (1-D, 2-D and broadcast batches) with every sum in k order, in float64."""
    a, b = numpy.asarray(a), numpy.asarray(b)
    dtype = numpy.result_type(a, b)
    if not numpy.issubdtype(dtype, numpy.floating):
        return numpy.matmul(a, b, out=out)  # integer products are exact in any order
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    batch = numpy.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    shape = (*batch, a2.shape[-2], b2.shape[-1])
    res = numpy.empty(shape, dtype)
    a3 = numpy.broadcast_to(a2, (*batch, *a2.shape[-2:]))
    b3 = numpy.broadcast_to(b2, (*batch, *b2.shape[-2:]))
    for idx in numpy.ndindex(*batch):
        _matmul_into(numpy.ascontiguousarray(a3[idx]), numpy.ascontiguousarray(b3[idx]),
                     res[idx])
    if a.ndim == 1:
        res = res[..., 0, :]
    if b.ndim == 1:
        res = res[..., 0]
    if out is None:
        return res
    out[...] = res
    return out
