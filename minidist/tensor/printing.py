"""How a Tensor prints: torch's layout, ``tensor([0.5000, 0.2500], requires_grad=True)``.

    >>> from minidist.tensor import Tensor
    >>> print(Tensor([0.5, 0.25]))
    tensor([0.5000, 0.2500])
    >>> print(Tensor([1.0, 2.0]), Tensor(3), f"{Tensor(0.123456):.3f}")
    tensor([1., 2.]) tensor(3) 0.123

torch's rules for a float tensor, looking at its finite non-zero values: all whole numbers
print as ``1.``; otherwise with 4 decimals; scientific (``1.0000e-05``) when the largest is
over 1e8, the smallest under 1e-4, or their ratio over 1000. Every element is padded to the
same width; more than 1000 elements print as the first and last 3 of each dim (NumPy's
summarisation, which torch copies). A dtype other than float32, int64 and bool, a GPU device,
``requires_grad`` and the op that made a tensor are added after the values, as torch does.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy

DEFAULT_DTYPES = (numpy.dtype(numpy.float32), numpy.dtype(numpy.int64), numpy.dtype(numpy.bool_))
PREFIX = "tensor("


def _float_format(values: numpy.ndarray) -> Callable[[Any], str]:
    """torch's ``_Formatter`` for floats: whole numbers, 4 decimals or scientific."""
    flat = values.reshape(-1).astype(numpy.float64)
    nz = numpy.abs(flat[numpy.isfinite(flat) & (flat != 0)])
    if nz.size == 0:
        return lambda v: f"{v:.0f}." if numpy.isfinite(v) else f"{v}"
    whole = bool(numpy.all(nz == numpy.ceil(nz)))
    big, small = float(nz.max()), float(nz.min())
    sci = big / small > 1000.0 or big > 1.0e8 or small < 1.0e-4
    if sci:
        return lambda v: f"{v:.4e}" if numpy.isfinite(v) else f"{v}"
    if whole:
        return lambda v: f"{v:.0f}." if numpy.isfinite(v) else f"{v}"
    return lambda v: f"{v:.4f}" if numpy.isfinite(v) else f"{v}"


def _corners(a: numpy.ndarray) -> numpy.ndarray:
    """The first and last 3 entries of every dim (what a summarised print shows)."""
    if a.ndim == 0:
        return a
    if a.shape[0] > 6:
        a = numpy.concatenate([a[:3], a[-3:]])
    return numpy.stack([_corners(row) for row in a]) if a.ndim > 1 else a


def format_values(host: numpy.ndarray) -> str:
    """The values part of the repr (what goes between ``tensor(`` and the suffixes)."""
    # summarised (over 1000 elements): only the printed corners choose the format, as torch
    sample = (_corners(host) if host.size > 1000 else host).reshape(-1)
    formatter: dict[str, Callable[[Any], str]] = {}
    if host.dtype.kind == "f":
        fmt = _float_format(sample)
        finite = sample[numpy.isfinite(sample) & (sample != 0)]  # torch's width rule
        width = max((len(fmt(float(v))) for v in finite), default=1)
        formatter["float_kind"] = lambda v: fmt(float(v)).rjust(width)
    elif host.dtype.kind in "iu":
        width = max((len(str(int(v))) for v in sample), default=1)
        formatter["int"] = lambda v: str(int(v)).rjust(width)
    elif host.dtype.kind == "b":
        width = 5 if not numpy.all(sample) else 4
        formatter["bool"] = lambda v: str(bool(v)).rjust(width)
    if host.ndim == 0:
        fn = formatter.get("float_kind") or formatter.get("int")
        return fn(host.item()).strip() if fn is not None else str(host.item())
    return numpy.array2string(host, separator=", ", prefix=PREFIX, formatter=formatter,  # type: ignore[arg-type]
                              threshold=1000, edgeitems=3, max_line_width=80)


def tensor_repr(host: numpy.ndarray, device: str | None, requires_grad: bool,
                op: str | None) -> str:
    """``tensor(<values>[, device=...][, dtype=...][, requires_grad=True | grad_fn=<...>])``."""
    parts = [format_values(host)]
    if device is not None:
        parts.append(f"device='{device}'")
    if host.size == 0:
        if host.ndim != 1:
            parts.append(f"size={tuple(host.shape)}")
        if host.dtype != DEFAULT_DTYPES[0]:
            parts.append(f"dtype=minidist.{host.dtype.name}")
    elif host.dtype not in DEFAULT_DTYPES:
        parts.append(f"dtype=minidist.{host.dtype.name}")
    if op:
        parts.append(f"grad_fn=<{op[:1].upper()}{op[1:]}Backward>")
    elif requires_grad:
        parts.append("requires_grad=True")
    return PREFIX + ", ".join(parts) + ")"
