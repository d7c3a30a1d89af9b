"""The buffers a CUDA launch sees: their keys, and many buffers joined into few launches.

A launch plan (``minidist.kernels.cuda``) is keyed by its arrays' ``array_key`` (address,
length, dtype, GPU). ``foreach_unscale_and_check_`` plans a list of buffers once with
``plan_runs``: consecutive pieces of one allocation (``_follows``) become one flat array
(``joined_array``), the rest are grouped by dtype, at most ``MAX_BUFFERS_PER_LAUNCH`` per launch.
"""

from __future__ import annotations

from typing import Any, Hashable, NamedTuple

import numpy as np

MAX_BUFFERS_PER_LAUNCH = 16
"""Buffer pairs one multi-buffer launch takes (kernel parameters: ~56 bytes per array)."""

try:  # CuPy is optional: without it only the simulator (NumPy arrays) can use this module
    import cupy as cupy_module
except ImportError:  # pragma: no cover - depends on the machine
    cupy_module = None


def is_cupy_array(a: Any) -> bool:
    return cupy_module is not None and isinstance(a, cupy_module.ndarray)


def array_key(a: Any) -> Hashable:
    """What a view depends on: address, length, dtype (and the GPU)."""
    if is_cupy_array(a):
        return (a.data.ptr, a.size, a.dtype.char, a.data.device_id)
    if isinstance(a, np.ndarray):
        return (a.ctypes.data, a.size, a.dtype.char, -1)
    return ("obj", id(a))  # a Numba device array: used as it is


def _root(a: np.ndarray) -> np.ndarray:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _follows(a: Any, b: Any) -> bool:
    """Does b start where a ends, same dtype, in one allocation (views of one flat buffer)?"""
    if a.dtype != b.dtype:
        return False
    if is_cupy_array(a):
        return a.data.mem is b.data.mem and a.data.ptr + a.nbytes == b.data.ptr
    root = _root(a)
    return (_root(b) is root and root.flags.c_contiguous
            and a.ctypes.data + a.nbytes == b.ctypes.data)


def joined_array(pieces: list[Any], n: int) -> Any:
    """One flat array over consecutive pieces of one allocation (checked by ``_follows``)."""
    first = pieces[0]
    if len(pieces) == 1:
        return first.reshape(-1)
    if is_cupy_array(first):
        return cupy_module.ndarray((n,), first.dtype, memptr=first.data)
    root = _root(first)
    return np.ndarray((n,), first.dtype, buffer=root, offset=first.ctypes.data - root.ctypes.data)


class Run(NamedTuple):
    """srcs[first..last] (and dsts), consecutive pieces of one buffer: one flat pair."""
    first: int
    last: int
    numel: int
    in_place: bool
    dtype: str


def plan_runs(srcs: list, dsts: list) -> list[list[Run]]:
    """Runs of joinable pairs, grouped by src dtype, at most MAX_BUFFERS_PER_LAUNCH a group.
    Only indices and sizes: a cached layout keeps no array alive."""
    runs: list[Run] = []
    for i, (src, dst) in enumerate(zip(srcs, dsts)):
        if src.size == 0:
            continue
        in_place = src is dst
        if runs:
            r = runs[-1]
            if (r.in_place == in_place and _follows(srcs[r.last], src)
                    and (in_place or _follows(dsts[r.last], dst))):
                runs[-1] = r._replace(last=i, numel=r.numel + int(src.size))
                continue
        runs.append(Run(i, i, int(src.size), in_place, src.dtype.char))
    by_dtype: dict[str, list[Run]] = {}
    for r in runs:
        by_dtype.setdefault(r.dtype, []).append(r)
    return [rs[k:k + MAX_BUFFERS_PER_LAUNCH] for rs in by_dtype.values()
            for k in range(0, len(rs), MAX_BUFFERS_PER_LAUNCH)]


def run_keys(arrays: list, runs: list[Run]) -> tuple[Hashable, ...]:
    """The view key of each run's joined array: its first piece's address, the run's length."""
    out = []
    for r in runs:
        k = array_key(arrays[r.first])
        out.append((k[0], r.numel, k[2], k[3]) if isinstance(k, tuple) and len(k) == 4 else k)
    return tuple(out)
