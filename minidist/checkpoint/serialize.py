"""``save`` / ``load``: torch.save and torch.load for state dicts, as data (npz + JSON, no pickle).

    minidist.save({"model": model.state_dict(), "epoch": 3}, "model.npz")   # any one rank
    state = minidist.load("model.npz", map_location="cpu")
    model.load_state_dict(state["model"])

Unlike ``save_checkpoint`` these are NOT collective: each call touches only the calling
process, so the usual ``if rank == 0: minidist.save(...)`` works. The file is the checkpoint
format (codec.py: a ``__meta__.json`` tree plus one npz entry per array) without the CRC-32
trailer, so ``load_checkpoint`` reads it too, and ``load`` reads checkpoints. What it stores:
arrays (NumPy or CuPy), Tensors and Parameters (stored as their arrays), numbers, strings,
None, and lists, tuples and dicts of them. ``load`` returns arrays where torch returns tensors;
``Module.load_state_dict`` and the optimizers' ``load_state_dict`` take arrays.

A tree that holds a whole ``Module`` (``minidist.save(model, f)``, as ``torch.save(model)``)
is pickled instead, in the same container, and ``load`` unpickles it only with
``weights_only=False``, as torch 2.6+ (pickled.py). ``map_location`` also takes torch's dict
form (``{"cuda:0": "cpu"}``).
"""

from __future__ import annotations

import io
import json
import os
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from minidist import xp as backend
from minidist.checkpoint import pickled
from minidist.checkpoint.codec import FORMAT_VERSION, META_KEY, decode, encode
from minidist.logger import rank_prefix
from minidist.tensor import Tensor

PathOrFile = str | os.PathLike | BinaryIO


def _untensor(obj: Any) -> Any:
    """``obj`` with every Tensor replaced by its array (the codec stores arrays)."""
    if isinstance(obj, Tensor):
        return obj.data
    if isinstance(obj, Mapping):
        return {k: _untensor(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_untensor(v) for v in obj)
    return obj


def save(obj: Any, f: PathOrFile, **torch_kwargs: Any) -> None:
    """Write ``obj`` (a state dict, or any tree of arrays/numbers/strings) to ``f``.

    Not collective: call it on the ranks that should write (usually ``if rank == 0:``). A path
    is written atomically (a temporary file beside it, then one rename).

    Args:
        obj: what to store (see the module docstring); a tree holding a Module is pickled.
        f: a path, or a binary file object opened for writing.
        torch_kwargs: torch's ``pickle_module``/``pickle_protocol``/... are accepted and
            ignored.

    Raises:
        TypeError: ``obj`` holds something that is not data (an object, a function) and no
            Module.
    """
    arrays: dict[str, np.ndarray] = {}
    meta: dict[str, Any] = {"format_version": FORMAT_VERSION, "checksum": "none"}
    if pickled.holds_module(obj):
        meta["pickled"] = True
        arrays[pickled.PICKLE_KEY] = pickled.dumps(obj)
    else:
        meta["state"] = encode(_untensor(obj), "", arrays)
    if META_KEY in arrays:
        raise ValueError(f"{rank_prefix()} save: the key {META_KEY!r} is reserved.")
    arrays[META_KEY] = np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8)
    if not isinstance(f, (str, os.PathLike)):
        np.savez(f, **arrays)
        return
    path = Path(f)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as out:
            np.savez(out, **arrays)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _move_all(obj: Any, where: Any) -> Any:
    if isinstance(obj, np.ndarray) and obj.ndim > 0 or backend.is_device_array(obj):
        return backend.move(obj, where)
    if isinstance(obj, dict):
        return {k: _move_all(v, where) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_move_all(v, where) for v in obj)
    return obj


def _one_location(map_location: Any) -> Any:
    """``map_location`` as one device (or None); torch's dict form names its target(s)."""
    if isinstance(map_location, Mapping):
        targets = {str(backend.device(v)) for v in map_location.values()}
        if len(targets) > 1:
            raise ValueError(f"{rank_prefix()} load: map_location={map_location!r} sends "
                             f"arrays to {sorted(targets)}; minidist stores arrays on the host, "
                             "so it takes one target device: map every entry to the same one.")
        return next(iter(targets), None)
    if map_location is not None and not isinstance(map_location, (str, backend.device)):
        raise TypeError(f"{rank_prefix()} load: map_location={map_location!r}; pass None, "
                        "'cpu', 'cuda:N', a minidist.device or a dict of them (functions are "
                        "not supported).")
    return map_location


def load(f: PathOrFile, map_location: Any = None, weights_only: bool | None = None,
         **torch_kwargs: Any) -> Any:
    """Read what :func:`save` (or ``save_checkpoint``) wrote; arrays come back as arrays.

    Args:
        f: a path, or a binary file object opened for reading.
        map_location: None or ``"cpu"`` (NumPy arrays, as stored), or a CUDA device
            (``"cuda:0"``, ``minidist.device(...)``) to put every array there, or torch's
            dict ``{saved device: target}`` whose targets are all one device (arrays are
            stored on the host, so that device is where they all go).
        weights_only: a file holding a pickled object (a whole Module) loads only with
            ``weights_only=False``, as torch 2.6+; data files load either way.
        torch_kwargs: torch's other options are accepted and ignored.

    Raises:
        FileNotFoundError: ``f`` is a path that does not exist.
        ValueError: the file is not one minidist wrote (or from a newer format).
        pickle.UnpicklingError: a pickled file without ``weights_only=False``.
    """
    name = str(f) if isinstance(f, (str, os.PathLike)) else getattr(f, "name", "<file object>")
    if isinstance(f, (str, os.PathLike)) and not Path(f).is_file():
        raise FileNotFoundError(f"{rank_prefix()} load: {name} does not exist. Check the path "
                                "(relative paths start at the current directory).")
    map_location = _one_location(map_location)
    try:
        with np.load(f, allow_pickle=False) as z:
            if META_KEY not in z.files:
                raise ValueError(f"it has no {META_KEY} entry")
            arrays = {k: z[k] for k in z.files}
        meta = json.load(io.BytesIO(arrays.pop(META_KEY).tobytes()))
    except Exception as e:  # noqa: BLE001 - zip, npy and JSON parsers raise many types
        raise ValueError(f"{rank_prefix()} load: {name} is not a file minidist.save wrote "
                         f"({type(e).__name__}: {e}). minidist reads its own npz format, not "
                         "torch's pickles: re-save the state dict with minidist.save.") from e
    if meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{rank_prefix()} load: {name} has format version "
                         f"{meta.get('format_version')}; this minidist reads {FORMAT_VERSION}.")
    if meta.get("pickled"):
        if weights_only is not False:
            raise pickle.UnpicklingError(
                f"{rank_prefix()} load: {name} holds a pickled object (a whole Module saved "
                "with minidist.save(model, f)). Unpickling runs code the file names, so, as in "
                "torch 2.6+, pass weights_only=False if you trust the file, or save and load "
                "model.state_dict() instead.")
        return pickled.loads(arrays[pickled.PICKLE_KEY], map_location)
    state = decode(meta["state"], arrays)
    if map_location is None or backend.device(map_location).type == "cpu":
        return state
    return _move_all(state, map_location)
