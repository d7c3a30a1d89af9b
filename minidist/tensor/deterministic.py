"""Deterministic mode: the same bits on any machine, not only run after run on this one.

    import minidist as md
    md.use_deterministic_algorithms(True)       # torch's name; before the model runs
    md.are_deterministic_algorithms_enabled()   # -> True

By default minidist runs NumPy's fast paths: the BLAS picks its GEMM kernel by CPU and NumPy its
``exp``/``log`` loops by SIMD level, so another machine rounds differently and a long run ends
elsewhere (the main job's final accuracy moves by a few tenths of a percent). The same seed
still gives the same bits on the same machine. torch's ``use_deterministic_algorithms`` promises
no more than that. Here the mode promises more: the products and the transcendental functions
of the tensor layer go through ``fixed_order`` (every sum in one order, in float64; ``exp`` and
``log`` without the C library or SIMD dispatch), so the main job's numbers are identical under
any ``OPENBLAS_CORETYPE`` and with NumPy's AVX-512/AVX2 loops disabled
(``NPY_DISABLE_CPU_FEATURES``), as CI checks (docs/determinism.md). Elementwise ``+ - * /``
and ``sqrt`` need nothing: IEEE 754 rounds them correctly everywhere.

The seam is one line where the tensor layer picks the module whose ``matmul``, ``exp`` and
``log`` it calls::

    math = xp if deterministic.state is OFF else deterministic.array_math(xp)

With the mode off that is ``xp`` itself (NumPy or CuPy), and nothing of this file runs.

    mode      on NumPy arrays              on CuPy arrays
    OFF       numpy                        cupy
    ON        fixed_order                  error: no fixed-order GPU kernels
    WARN      fixed_order                  cupy, with one warning (torch's warn_only=True)

Covered: ``matmul``, ``linear`` (and everything that multiplies through them), ``exp``, ``log``,
``softmax``, ``log_softmax``, ``cross_entropy``. Other transcendental functions (``tanh``,
``sigmoid``, ``erf``, ``pow`` with a tensor exponent) still use NumPy's loops.
"""

from __future__ import annotations

import enum
import warnings
from typing import Any

import numpy


class Mode(enum.Enum):
    """Which kernels the tensor layer's products and transcendental functions use."""

    OFF = "off"    # NumPy/CuPy as they come: fast, the same bits on the same machine
    ON = "on"      # fixed_order on the CPU; a GPU array is an error
    WARN = "warn"  # fixed_order on the CPU; a GPU array warns once and runs CuPy's kernels


OFF = Mode.OFF
state = Mode.OFF
"""The current mode: read it; set it with ``use_deterministic_algorithms``."""
_warned_gpu = False


def use_deterministic_algorithms(mode: bool, *, warn_only: bool = False) -> None:
    """Turn deterministic mode on or off (torch's signature).

    Args:
        mode: True for the same bits on any machine (see the module docstring), False for
            NumPy's fast paths (the default).
        warn_only: with ``mode``, an op that has no deterministic kernel (any op on a GPU
            array) warns once instead of raising.
    """
    global state
    if not isinstance(mode, bool):
        raise TypeError(f"use_deterministic_algorithms: mode must be True or False, got "
                        f"{mode!r}")
    state = Mode.OFF if not mode else (Mode.WARN if warn_only else Mode.ON)
    if mode:
        from minidist.tensor import fixed_order  # compiles on first use (cached on disk)
        fixed_order.exp(numpy.zeros(1, numpy.float32))


def are_deterministic_algorithms_enabled() -> bool:
    """True while deterministic mode is on (torch's name)."""
    return state is not Mode.OFF


def is_deterministic_algorithms_warn_only_enabled() -> bool:
    """True when deterministic mode is on with ``warn_only=True`` (torch's name)."""
    return state is Mode.WARN


def array_math(xp: Any) -> Any:
    """The module whose ``matmul``, ``exp`` and ``log`` to call on ``xp`` arrays while the mode
    is on: ``fixed_order`` for NumPy; for CuPy an error (``ON``) or CuPy itself (``WARN``)."""
    from minidist.tensor import fixed_order
    if state is Mode.OFF:
        return xp
    if xp is numpy:
        return fixed_order
    if state is Mode.ON:
        raise RuntimeError(
            "deterministic mode: matmul/exp/log on a GPU array have no fixed-order kernel "
            "(cuBLAS and CuPy pick their own summation order). Run on the CPU, call "
            "md.use_deterministic_algorithms(True, warn_only=True) to accept CuPy's kernels, "
            "or turn the mode off.")
    global _warned_gpu
    if not _warned_gpu:
        _warned_gpu = True
        warnings.warn("deterministic mode (warn_only): GPU arrays use CuPy's kernels, whose "
                      "bits may differ between GPUs", RuntimeWarning, stacklevel=3)
    return xp
