"""Tensor factories with torch's names and defaults: tensor, from_numpy, zeros, randn, arange...

    import minidist
    x = minidist.tensor([[1.0, 2.0]])              # float32: Python floats -> the default dtype
    w = minidist.randn(3, 4, requires_grad=True)    # float32, from the manual_seed generator
    i = minidist.arange(5)                          # int64 (all-int arguments), as torch
    a = minidist.from_numpy(np.ones(3))             # float64 kept, memory shared, as torch

Dtype rule (torch's): factories with no ``dtype`` make float32 (``arange`` with only ints:
int64); ``tensor(data)`` makes float32 from Python floats but keeps a NumPy array's dtype and
copies it; ``from_numpy``/``as_tensor`` keep dtype and share memory. ``Tensor(array)`` is the
sharing wrapper too (minidist's historical constructor, see docs/porting.md).
Random draws come from ``default_generator()`` on the host (so one seed gives the same values
on CPU and GPU), then move to ``device``.
"""

from __future__ import annotations

from typing import Any

import numpy

from minidist import xp as backend
from minidist.tensor.core import Tensor, as_array, error
from minidist.tensor.random import default_generator, host_generator

FLOAT = numpy.dtype(numpy.float32)  # torch's default dtype


def _shape(op: str, size: tuple) -> tuple[int, ...]:
    """``zeros(2, 3)`` and ``zeros((2, 3))`` both mean shape (2, 3)."""
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        size = tuple(size[0])
    if not all(isinstance(s, (int, numpy.integer)) and s >= 0 for s in size):
        raise ValueError(error(op, f"size {size!r} must be non-negative ints, e.g. {op}(2, 3)."))
    return tuple(int(s) for s in size)


def _make(host: Any, dtype: Any, device: Any, requires_grad: bool) -> Tensor:
    """A leaf Tensor from a host array: cast to ``dtype``, moved to ``device``."""
    array = host.astype(dtype, copy=False) if dtype is not None else host
    if device is not None:
        array = backend.move(array, device)
    elif backend.default_device() == "cuda":
        array = backend.move(array, "cuda")
    return Tensor(array, requires_grad=requires_grad)


def tensor(data: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False
           ) -> Tensor:
    """A new leaf Tensor holding a COPY of ``data`` (torch.tensor).

    Python floats become float32 and ints int64; NumPy arrays keep their dtype (as torch keeps
    a float64 array float64); pass ``dtype=`` to choose.
    """
    if isinstance(data, Tensor):
        data = data.array
    array = as_array(data, dtype).copy()  # never shares memory with data, as torch.tensor
    return _make(array, None, device, requires_grad)


def from_numpy(array: numpy.ndarray) -> Tensor:
    """A Tensor SHARING ``array``'s memory and dtype (torch.from_numpy: float64 stays float64)."""
    if not isinstance(array, numpy.ndarray):
        raise TypeError(error("from_numpy", f"expected a numpy.ndarray, got "
                              f"{type(array).__name__}. Use minidist.tensor(data) for lists."))
    return Tensor(array)


def as_tensor(data: Any, dtype: Any = None, device: Any = None) -> Tensor:
    """A Tensor sharing ``data``'s memory when dtype and device allow (torch.as_tensor)."""
    if isinstance(data, Tensor) and dtype is None and device is None:
        return data
    return _make(as_array(data, dtype), None, device, False)


def zeros(*size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False
          ) -> Tensor:
    """A tensor of zeros, float32 unless ``dtype`` says otherwise."""
    return _make(numpy.zeros(_shape("zeros", size), dtype or FLOAT), None, device, requires_grad)


def ones(*size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False
         ) -> Tensor:
    """A tensor of ones, float32 unless ``dtype`` says otherwise."""
    return _make(numpy.ones(_shape("ones", size), dtype or FLOAT), None, device, requires_grad)


def empty(*size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False
          ) -> Tensor:
    """An uninitialised tensor (here: zeros, so nothing depends on garbage)."""
    return _make(numpy.zeros(_shape("empty", size), dtype or FLOAT), None, device, requires_grad)


def full(size: Any, fill_value: Any, dtype: Any = None, device: Any = None,
         requires_grad: bool = False) -> Tensor:
    """A tensor filled with ``fill_value`` (float32 for a float, int64 for an int, as torch)."""
    if dtype is None:
        dtype = numpy.int64 if isinstance(fill_value, (int, numpy.integer)) and not isinstance(
            fill_value, bool) else (numpy.bool_ if isinstance(fill_value, bool) else FLOAT)
    return _make(numpy.full(_shape("full", (size,)), fill_value, dtype), None, device,
                 requires_grad)


def rand(*size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False
         ) -> Tensor:
    """Uniform draws in [0, 1) from the ``manual_seed`` generator (float32)."""
    host = default_generator().random(_shape("rand", size))
    return _make(host, dtype or FLOAT, device, requires_grad)


def randn(*size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False
          ) -> Tensor:
    """Standard normal draws from the ``manual_seed`` generator (float32)."""
    host = default_generator().standard_normal(_shape("randn", size))
    return _make(host, dtype or FLOAT, device, requires_grad)


def randint(low: int, high: int | None = None, size: Any = (), *, generator: Any = None,
            dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """Integers in [low, high) (``randint(high, size)`` means low=0), int64 as torch; drawn
    from ``generator`` (a ``minidist.Generator``) when given."""
    if isinstance(high, (tuple, list)):  # randint(high, size), torch's short form
        low, high, size = 0, low, high
    elif high is None:
        low, high = 0, low
    host = host_generator(generator).integers(low, high, _shape("randint", (size,)))
    return _make(host, dtype or numpy.int64, device, False)


def randperm(n: int, *, generator: Any = None, dtype: Any = None, device: Any = None,
             requires_grad: bool = False) -> Tensor:
    """torch's ``randperm``: a random permutation of ``0..n-1`` (int64), drawn from
    ``generator`` (a ``minidist.Generator``) or the ``manual_seed`` generator."""
    host = host_generator(generator).permutation(int(n))
    return _make(host, dtype or numpy.int64, device, False)


def multinomial(input: Any, num_samples: int, replacement: bool = False,  # noqa: A002
                generator: Any = None) -> Tensor:
    """torch's ``multinomial``: ``num_samples`` category indices per row of weights ``input``.

    ``input`` is (C,) or (N, C) non-negative weights (they need not sum to 1); the result is
    int64 of shape (num_samples,) or (N, num_samples) on ``input``'s device, drawn on the host
    from ``generator`` (a ``numpy.random.Generator``; default: the ``manual_seed`` one).
    Without replacement a category is drawn at most once per row.

    Raises:
        ValueError: not 1-D/2-D, a negative or non-finite weight, a row summing to 0, or
            more samples than non-zero categories without replacement.
    """
    data = input.array if isinstance(input, Tensor) else as_array(input)
    host = backend.to_host(data).astype(numpy.float64)
    if host.ndim not in (1, 2) or num_samples < 1:
        raise ValueError(error("multinomial", f"expected (C,) or (N, C) weights and "
                               f"num_samples >= 1, got shape {host.shape}, {num_samples}."))
    rows = host.reshape(-1, host.shape[-1])
    if not numpy.all(numpy.isfinite(rows)) or numpy.any(rows < 0):
        raise ValueError(error("multinomial", "weights must be finite and >= 0 (pass "
                               "probabilities, e.g. softmax(logits), not logits)."))
    totals = rows.sum(axis=1)
    if numpy.any(totals <= 0):
        raise ValueError(error("multinomial", "a row of weights sums to 0: there is nothing "
                               "to draw from."))
    if not replacement and numpy.any((rows > 0).sum(axis=1) < num_samples):
        raise ValueError(error("multinomial", f"cannot draw {num_samples} samples without "
                               "replacement from a row with fewer non-zero weights; pass "
                               "replacement=True or fewer samples."))
    rng = generator if generator is not None else default_generator()
    out = numpy.stack([rng.choice(rows.shape[1], size=num_samples, replace=replacement,
                                  p=row / row.sum()) for row in rows]).astype(numpy.int64)
    out = out.reshape(host.shape[:-1] + (num_samples,))
    return Tensor(backend.move(out, backend.device_of(data)))


def arange(start: Any, end: Any = None, step: Any = 1, dtype: Any = None, device: Any = None,
           requires_grad: bool = False) -> Tensor:
    """``start, start+step, ...`` below ``end``: int64 when all arguments are ints, else float32."""
    if end is None:
        start, end = 0, start
    if dtype is None:
        ints = all(isinstance(v, (int, numpy.integer)) for v in (start, end, step))
        dtype = numpy.int64 if ints else FLOAT
    return _make(numpy.arange(start, end, step), dtype, device, requires_grad)


def _like(t: Any, dtype: Any, device: Any) -> tuple[tuple[int, ...], Any, Any]:
    data = t.array if isinstance(t, Tensor) else as_array(t)
    return tuple(data.shape), dtype or data.dtype, device or backend.device_of(data)


def zeros_like(t: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False
               ) -> Tensor:
    shape, dtype, device = _like(t, dtype, device)
    return zeros(shape, dtype=dtype, device=device, requires_grad=requires_grad)


def ones_like(t: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False
              ) -> Tensor:
    shape, dtype, device = _like(t, dtype, device)
    return ones(shape, dtype=dtype, device=device, requires_grad=requires_grad)


def empty_like(t: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False
               ) -> Tensor:
    shape, dtype, device = _like(t, dtype, device)
    return empty(shape, dtype=dtype, device=device, requires_grad=requires_grad)


def full_like(t: Any, fill_value: Any, dtype: Any = None, device: Any = None,
              requires_grad: bool = False) -> Tensor:
    shape, dtype, device = _like(t, dtype, device)
    return full(shape, fill_value, dtype=dtype, device=device, requires_grad=requires_grad)


def rand_like(t: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False
              ) -> Tensor:
    shape, dtype, device = _like(t, dtype, device)
    return rand(shape, dtype=dtype, device=device, requires_grad=requires_grad)


def randn_like(t: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False
               ) -> Tensor:
    shape, dtype, device = _like(t, dtype, device)
    return randn(shape, dtype=dtype, device=device, requires_grad=requires_grad)
