"""A state tree <-> JSON-able data plus named arrays, losslessly.

    w, arrays = np.ones(2, np.float32), {}
    tree = encode({"model": {"w": w}, "opt": {"state": {0: {"step": np.float32(3)}}}}, "", arrays)
    # tree == {"model": {"w": {"__array__": "model/w"}}, "opt": {"state": {"__items__": [[0,
    #          {"step": {"__array__": "opt/state/0/step", "__scalar__": True}}]]}}}
    # arrays == {"model/w": w, "opt/state/0/step": array(3., dtype=float32)}
    decode(tree, arrays)    # the same tree back

Dicts with non-string keys (torch's optimizer state is keyed by parameter index), tuples, NumPy
scalars (kept as 0-d arrays, so float32 stays float32), big integers (PCG64 RNG states) and
bfloat16 arrays (npz stores their bytes as "V2"; the entry names the dtype) all come back as
they went in. Arrays may be NumPy or CuPy (copied to the host).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from minidist import xp as backend

META_KEY = "__meta__.json"  # the npz entry that holds the JSON tree (as uint8 bytes)
FORMAT_VERSION = 1


def encode(obj: Any, path: str, arrays: dict[str, np.ndarray], devices: bool = False) -> Any:
    """Turn a state tree into JSON-able data; arrays go into ``arrays`` under ``path``.

    With ``devices``, a device (CuPy) array's entry also records where it was
    (``"__device__": "cuda:0"``) for ``load``'s ``map_location``; decode ignores it."""
    if isinstance(obj, np.generic) or backend.is_device_array(obj) or isinstance(obj, np.ndarray):
        key = path or "root"
        host = np.asarray(backend.to_host(obj))
        arrays[key] = host if host.ndim == 0 else np.ascontiguousarray(host)
        entry = {"__array__": key, "__scalar__": True} if isinstance(obj, np.generic) else {
            "__array__": key}
        if host.dtype.kind == "V" and host.dtype.names is None:  # bfloat16 & co (ml_dtypes):
            entry["__dtype__"] = host.dtype.name  # npz keeps only the bytes ("V2")
        if devices and backend.is_device_array(obj):
            entry["__device__"] = str(backend.device_of(obj))
        return entry
    if isinstance(obj, Mapping):
        if all(isinstance(k, str) for k in obj) and not any(k.startswith("__") for k in obj):
            return {k: encode(v, f"{path}/{k}" if path else k, arrays, devices)
                    for k, v in obj.items()}
        items = []
        for k, v in obj.items():
            if not isinstance(k, (str, int, float, bool)) and k is not None:
                raise TypeError(f"save_checkpoint: dict key {k!r} at {path or '<root>'} has type "
                                f"{type(k).__name__}; use str or int keys.")
            items.append([k, encode(v, f"{path}/{k}" if path else str(k), arrays, devices)])
        return {"__items__": items}
    if isinstance(obj, tuple):
        return {"__tuple__": [encode(v, f"{path}/{i}", arrays, devices)
                              for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [encode(v, f"{path}/{i}", arrays, devices) for i, v in enumerate(obj)]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"save_checkpoint: value at {path or '<root>'} has type {type(obj).__name__}, "
                    "which a checkpoint cannot store as data. Store arrays, numbers, strings, "
                    "lists and dicts (convert objects with their state_dict()).")


def ml_dtype(name: str) -> np.dtype:
    """The ``ml_dtypes`` dtype called ``name`` (``"bfloat16"``), importing ml_dtypes: a process
    that loads a checkpoint may not have asked for bfloat16 yet (tensor/dtypes.py)."""
    import ml_dtypes

    try:
        return np.dtype(getattr(ml_dtypes, name))
    except AttributeError:
        raise ValueError(f"load: an array of dtype {name!r}, which this ml_dtypes "
                         f"({ml_dtypes.__version__}) does not have: upgrade ml_dtypes "
                         "(`pip install -U ml_dtypes`) to read it.") from None


def decode(obj: Any, arrays: Mapping[str, np.ndarray]) -> Any:
    """The inverse of :func:`encode`: ``obj`` with every array reference replaced by its array."""
    if isinstance(obj, dict):
        if "__array__" in obj:
            arr = arrays[obj["__array__"]]
            if "__dtype__" in obj:
                arr = arr.view(ml_dtype(obj["__dtype__"]))
            return arr[()] if obj.get("__scalar__") else arr
        if "__items__" in obj:
            return {k: decode(v, arrays) for k, v in obj["__items__"]}
        if "__tuple__" in obj:
            return tuple(decode(v, arrays) for v in obj["__tuple__"])
        return {k: decode(v, arrays) for k, v in obj.items()}
    if isinstance(obj, list):
        return [decode(v, arrays) for v in obj]
    return obj
