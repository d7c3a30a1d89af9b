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
or another object that is not data (a dataclass config) is pickled instead, in the same
container, and ``load`` unpickles it with only allow-listed classes unless
``weights_only=False``, as torch 2.6+ (pickled.py, safe_globals.py). Each array records the
device it was saved from, so ``map_location``'s dict form (``{"cuda:0": "cuda:1"}``) moves
what torch's would and leaves the rest on the CPU.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable, Mapping
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
        return obj.array
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
    if not pickled.holds_module(obj):
        try:
            meta["state"] = encode(_untensor(obj), "", arrays, devices=True)
        except TypeError:  # an object that is not data (a dataclass config): pickle, as torch
            arrays.clear()
    if "state" not in meta:
        meta["pickled"] = True
        arrays[pickled.PICKLE_KEY] = pickled.dumps(obj)
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


def _placement(map_location: Any) -> Callable[[str], Any]:
    """torch's ``map_location`` as a function: saved device -> where the array goes (None:
    the host, as stored).

    None keeps every array on the host; a device (``"cuda:1"``, ``minidist.device``) takes
    every array there; a dict ``{saved: target}`` moves the arrays saved on ``saved`` and
    leaves the others where they were saved, as torch: ``{"cuda:0": "cuda:1"}`` keeps the
    arrays saved from the CPU on the CPU, so nothing needs a GPU unless one was saved there.
    """
    if map_location is None:
        return lambda saved: None
    if isinstance(map_location, Mapping):
        table = {str(backend.device(k)): str(backend.device(v)) for k, v in map_location.items()}
        return lambda saved: table.get(saved, saved)
    if not isinstance(map_location, (str, backend.device)):
        raise TypeError(f"{rank_prefix()} load: map_location={map_location!r}; pass None, "
                        "'cpu', 'cuda:N', a minidist.device or a dict of them (functions are "
                        "not supported).")
    target = str(backend.device(map_location))
    return lambda saved: target


def _move(array: Any, saved: str, target: Any) -> Any:
    """``array`` on ``target``; without that device, an error that says how to load here."""
    try:
        return backend.move(array, target)
    except backend.DeviceUnavailableError as e:
        raise backend.DeviceUnavailableError(
            f"{rank_prefix()} load: map_location sends an array saved on {saved} to {target}, "
            f"and this machine cannot use it ({e}). To load the file here, pass "
            f"map_location='cpu' (or a dict that maps {saved!r} to 'cpu').") from e


def _place_arrays(tree: Any, arrays: dict[str, np.ndarray], place: Callable[[str], Any]) -> None:
    """Move each array of the stored tree to ``place(the device it was saved from)``."""
    if isinstance(tree, dict):
        if "__array__" in tree:
            target = place(tree.get("__device__", "cpu"))
            key = tree["__array__"]
            if target is not None and backend.device(target).type != "cpu" \
                    and arrays[key].ndim > 0 and not tree.get("__scalar__"):
                arrays[key] = _move(arrays[key], tree.get("__device__", "cpu"), target)
            return
        for v in (tree["__items__"] if "__items__" in tree else tree.get(
                "__tuple__", tree.values())):
            _place_arrays(v, arrays, place)
    elif isinstance(tree, list):
        for v in tree:
            _place_arrays(v, arrays, place)


def load(f: PathOrFile, map_location: Any = None, weights_only: bool | None = None,
         **torch_kwargs: Any) -> Any:
    """Read what :func:`save` (or ``save_checkpoint``) wrote; arrays come back as arrays.

    Args:
        f: a path, or a binary file object opened for reading.
        map_location: None or ``"cpu"`` (NumPy arrays, as stored), a CUDA device
            (``"cuda:0"``, ``minidist.device(...)``) to put every array there, or torch's
            dict ``{saved device: target}``: arrays saved on a device the dict names go to its
            target, the others stay where they were saved (the CPU's on the CPU), as torch.
        weights_only: a pickled file (a whole Module, or a tree holding a dataclass or other
            object) unpickles only allow-listed classes unless ``weights_only=False``, as torch
            2.6+ (``minidist.serialization.safe_globals``); data files load either way.
        torch_kwargs: torch's other options are accepted and ignored.

    Raises:
        FileNotFoundError: ``f`` is a path that does not exist.
        ValueError: the file is not one minidist wrote (or from a newer format).
        pickle.UnpicklingError: a pickled file that names a class not allow-listed, without
            ``weights_only=False``.
    """
    name = str(f) if isinstance(f, (str, os.PathLike)) else getattr(f, "name", "<file object>")
    if isinstance(f, (str, os.PathLike)) and not Path(f).is_file():
        raise FileNotFoundError(f"{rank_prefix()} load: {name} does not exist. Check the path "
                                "(relative paths start at the current directory).")
    place = _placement(map_location)
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
        return pickled.loads(arrays[pickled.PICKLE_KEY], place,
                             weights_only=weights_only is not False, name=name)
    _place_arrays(meta["state"], arrays, place)
    return decode(meta["state"], arrays)
