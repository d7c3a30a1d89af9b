"""default_collate: a list of samples -> one batch of Tensors, field by field (torch's rules).

    samples = [(x0, y0), (x1, y1), (x2, y2)]     # what a Dataset's __getitem__ returns
    xb, yb = default_collate(samples)             # Tensors: xb = stack(x0, x1, x2), yb = ...

A sample may be a Tensor, a NumPy array or NumPy scalar, a Python number, or a tuple, list or
dict of those (nested); each field is stacked along a new first dim into one Tensor (no
gradient; on the samples' device; a Tensor's dtype and an array's dtype are kept; Python
floats become float64 and ints int64, as torch's ``default_collate`` makes them). Strings
stay a list. Anything else, and ragged fields, raise a ``TypeError``/``ValueError`` that names
the field and says what to return instead (never an ``object`` array).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from minidist import xp as backend
from minidist.tensor import Tensor


def _field_name(path: tuple) -> str:
    return "sample" + "".join(f"[{p!r}]" for p in path)


def _stack(samples: list, path: tuple) -> Tensor:
    """One field of every sample, stacked into a Tensor."""
    first = samples[0]
    if isinstance(first, Tensor) or backend.is_device_array(first):
        arrays = [s.array if isinstance(s, Tensor) else s for s in samples]
        xp = backend.get_array_module(*arrays)
    else:
        if isinstance(first, bool):
            dtype: Any = np.bool_
        elif isinstance(first, int):
            dtype = np.int64
        elif isinstance(first, float):
            dtype = np.float64
        else:
            dtype = None
        arrays = [s.numpy() if isinstance(s, Tensor) else np.asarray(s, dtype=dtype)
                  for s in samples]
        xp = np
    shapes = {tuple(a.shape) for a in arrays}
    if len(shapes) > 1:
        raise ValueError(f"DataLoader: {_field_name(path)} has different shapes across the "
                         f"batch ({sorted(shapes)[:3]}); pad the samples to one shape or pass "
                         "a collate_fn that batches them.")
    out = xp.stack(arrays)
    if out.dtype == object or out.dtype.kind in "OUSV":
        raise TypeError(f"DataLoader: {_field_name(path)} is a {type(first).__name__} that "
                        f"does not batch into a numeric array (dtype {out.dtype}). Return "
                        "Tensors, NumPy arrays or numbers from __getitem__, or pass a "
                        "collate_fn.")
    return Tensor(out)


def default_collate(samples: list, _path: tuple = ()) -> Any:
    """Batch a list of samples (see the module docstring): torch's ``default_collate``.

    Returns:
        A Tensor, or a tuple / list / dict of them shaped like one sample.

    Raises:
        TypeError: a field that is not a Tensor, array, number, string or container of them.
        ValueError: a field whose shape differs between samples, or samples with different
            numbers of fields.
    """
    first = samples[0]
    if isinstance(first, (str, bytes)):
        return list(samples)
    if isinstance(first, Mapping):
        return {k: default_collate([s[k] for s in samples], _path + (k,)) for k in first}
    if isinstance(first, Sequence) and not isinstance(first, np.ndarray):
        if len({len(s) for s in samples}) > 1:
            raise ValueError(f"DataLoader: the samples of {_field_name(_path)} have different "
                             "numbers of fields; every __getitem__ must return the same.")
        fields = [default_collate([s[k] for s in samples], _path + (k,))
                  for k in range(len(first))]
        return tuple(fields) if isinstance(first, tuple) else fields
    if isinstance(first, (Tensor, np.ndarray, np.generic, int, float, bool)) or \
            backend.is_device_array(first):
        return _stack(samples, _path)
    raise TypeError(f"DataLoader: {_field_name(_path)} is a {type(first).__name__}, which the "
                    "default collate cannot batch. Return Tensors, NumPy arrays or numbers "
                    "(or tuples/dicts of them) from __getitem__, or pass a collate_fn.")
