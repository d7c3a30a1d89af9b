"""Cross-entropy on a GPU in two fused CuPy kernels: log-softmax + NLL forward, and backward.

    losses, m, s = forward_kernel()(logits, target, c, ignore_index, nan)   # (N,) each
    grad = backward_kernel()(logits, m, s, target, scale, per_row, c, ignore_index, nan)

What ``cross_entropy`` runs for CuPy arrays (class-index targets, no class weights, no label
smoothing). The NumPy formulas of ``losses.cross_entropy_on_device`` take about ten CuPy
calls forward (max, subtract, exp, sum, log, arange, gather, where, ...) and as many backward,
each a launch with its own host cost; these kernels do each direction in one launch, one thread per
row forward (it walks its row three times: max, sum of exp, the target's logit) and one
thread per element backward::

    forward, row i:   m_i = max_c x_ic     s_i = sum_c exp(x_ic - m_i)
                      loss_i = log(s_i) - (x_i,t_i - m_i)   (0 if t_i == ignore_index,
                                                             NaN if t_i is outside [0, C))
    backward, (i, c): grad_ic = (exp(x_ic - m_i) / s_i - [c == t_i]) * scale  (0 if ignored)

``scale`` is ``g`` per row (reduction "none") or one device scalar (``g``, or ``g / count``
for "mean"), so nothing is read on the host. The kernels are compiled by CuPy on first use;
when that fails (an unusual toolkit), ``available()`` turns False after one warning and
``cross_entropy`` takes the CuPy-array formulas instead, with the same results.
"""

from __future__ import annotations

import warnings
from typing import Any

from minidist.logger import rank_prefix

_FORWARD = r"""
    const long long row = i * c;
    T mx = x[row];
    for (long long j = 1; j < c; ++j) { mx = max(mx, x[row + j]); }
    T sum = 0;
    for (long long j = 0; j < c; ++j) { sum += exp(x[row + j] - mx); }
    m = mx;
    s = sum;
    if (t == ignore) { loss = 0; }
    else if (t < 0 || t >= c) { loss = nan; }
    else { loss = log(sum) - (x[row + t] - mx); }
"""

_BACKWARD = r"""
    const long long r = i / c;
    const long long j = i - r * c;
    const long long tr = t[r];
    if (tr == ignore) { grad = 0; }
    else if (tr < 0 || tr >= c) { grad = nan; }
    else {
        T p = exp(x - m[r]) / s[r];
        if (j == tr) { p -= 1; }
        grad = p * scale[per_row ? r : 0];
    }
"""

_kernels: dict[str, Any] = {}
_failed = False


def available() -> bool:
    """False once compiling or launching the kernels failed (then the formulas are used)."""
    return not _failed


def give_up(exc: BaseException) -> None:
    """Use the CuPy-array formulas from now on, and say so once."""
    global _failed
    if _failed:
        return
    _failed = True
    warnings.warn(f"{rank_prefix()} cross_entropy: the fused CuPy kernels cannot run here "
                  f"({type(exc).__name__}: {exc}); using the CuPy-array formulas instead (same "
                  "results, more kernel launches).", RuntimeWarning, stacklevel=3)


def forward_kernel() -> Any:
    """The forward ``cupy.ElementwiseKernel`` (built once)."""
    kernel = _kernels.get("forward")
    if kernel is None:
        import cupy

        kernel = _kernels["forward"] = cupy.ElementwiseKernel(
            "raw T x, int64 t, int64 c, int64 ignore, T nan", "T loss, T m, T s", _FORWARD,
            "minidist_cross_entropy_forward")
    return kernel


def backward_kernel() -> Any:
    """The backward ``cupy.ElementwiseKernel`` (built once)."""
    kernel = _kernels.get("backward")
    if kernel is None:
        import cupy

        kernel = _kernels["backward"] = cupy.ElementwiseKernel(
            "T x, raw T m, raw T s, raw int64 t, raw T scale, bool per_row, int64 c, "
            "int64 ignore, T nan", "T grad", _BACKWARD, "minidist_cross_entropy_backward")
    return kernel
