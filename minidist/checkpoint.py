"""Atomic training checkpoints stored as data (npz + JSON), never as pickles.

    from minidist.checkpoint import save_checkpoint, load_checkpoint, latest_checkpoint
    save_checkpoint(path, {"model": model.state_dict(), "optimizer": opt.state_dict(),
                           "epoch": 3, "global_step": 420})            # rank 0 writes, all wait
    ckpt = load_checkpoint(latest_checkpoint("runs/exp1"))             # any rank reads
    model.load_state_dict(ckpt["model"])

One checkpoint is ONE ``.npz`` file, loaded with ``allow_pickle=False``:

    checkpoint-000004.npz
    |-- __meta__.json        JSON tree of everything that is not an array (as uint8 bytes);
    |                        arrays appear in it as {"__array__": "<key>"}
    |-- model/fc1.weight     every array, under its path in the state tree
    |-- optimizer/state/0/momentum_buffer
    '-- ...

Writing is crash-safe: rank 0 writes to a temporary file in the same directory, flushes and
fsyncs it, then ``os.replace`` puts it in place in one step (a reader sees the old file or the
new one, never half of one), then every rank meets at a barrier so nobody reads it too early.
A truncated or foreign file raises :class:`CheckpointError` naming the file and the problem.

Nested state is encoded losslessly: dicts with non-string keys (torch's optimizer state is
keyed by parameter index), tuples, NumPy scalars (kept as 0-d arrays, so float32 stays float32)
and big integers (PCG64 RNG states) all come back as they went in.
"""

from __future__ import annotations

import io
import json
import os
import re
import zipfile
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from minidist import xp as backend
from minidist.log import get_logger, rank_prefix

log = get_logger(__name__)

META_KEY = "__meta__.json"
FORMAT_VERSION = 1
_NAME_RE = re.compile(r"^checkpoint-(\d+)\.npz$")


class CheckpointError(RuntimeError):
    """A checkpoint could not be read or does not match what it is loaded into."""


def checkpoint_path(directory: str | Path, epoch: int) -> Path:
    """The file name of the checkpoint written after ``epoch`` epochs: ``checkpoint-000004.npz``."""
    return Path(directory) / f"checkpoint-{int(epoch):06d}.npz"


# ----------------------------------------------------------------------------- codec


def _encode(obj: Any, path: str, arrays: dict[str, np.ndarray]) -> Any:
    """Turn a state tree into JSON-able data; arrays go into ``arrays`` under ``path``."""
    if isinstance(obj, np.generic) or backend.is_device_array(obj) or isinstance(obj, np.ndarray):
        key = path or "root"
        host = np.asarray(backend.to_host(obj))
        arrays[key] = host if host.ndim == 0 else np.ascontiguousarray(host)
        return {"__array__": key, "__scalar__": True} if isinstance(obj, np.generic) else {
            "__array__": key}
    if isinstance(obj, Mapping):
        if all(isinstance(k, str) for k in obj) and not any(k.startswith("__") for k in obj):
            return {k: _encode(v, f"{path}/{k}" if path else k, arrays) for k, v in obj.items()}
        items = []
        for k, v in obj.items():
            if not isinstance(k, (str, int, float, bool)) and k is not None:
                raise TypeError(f"save_checkpoint: dict key {k!r} at {path or '<root>'} has type "
                                f"{type(k).__name__}; use str or int keys.")
            items.append([k, _encode(v, f"{path}/{k}" if path else str(k), arrays)])
        return {"__items__": items}
    if isinstance(obj, tuple):
        return {"__tuple__": [_encode(v, f"{path}/{i}", arrays) for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [_encode(v, f"{path}/{i}", arrays) for i, v in enumerate(obj)]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"save_checkpoint: value at {path or '<root>'} has type {type(obj).__name__}, "
                    "which a checkpoint cannot store as data. Store arrays, numbers, strings, "
                    "lists and dicts (convert objects with their state_dict()).")


def _decode(obj: Any, arrays: Mapping[str, np.ndarray]) -> Any:
    if isinstance(obj, dict):
        if "__array__" in obj:
            arr = arrays[obj["__array__"]]
            return arr[()] if obj.get("__scalar__") else arr
        if "__items__" in obj:
            return {k: _decode(v, arrays) for k, v in obj["__items__"]}
        if "__tuple__" in obj:
            return tuple(_decode(v, arrays) for v in obj["__tuple__"])
        return {k: _decode(v, arrays) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_decode(v, arrays) for v in obj]
    return obj


# ----------------------------------------------------------------------------- write / read


def _dist() -> tuple[int, int, Any]:
    """(rank, world_size, barrier) of the default process group, or a single process."""
    try:
        from minidist import comm
        if comm.is_initialized():
            return comm.get_rank(), comm.get_world_size(), comm.barrier
    except (ImportError, AttributeError):
        pass
    return 0, 1, lambda: None


def save_checkpoint(path: str | Path, state: Mapping[str, Any], *, rank0_only: bool = True) -> Path:
    """Write ``state`` (a tree of arrays, numbers, strings, lists, dicts) to ``path`` atomically.

    Rank 0 writes a temporary file in the same directory, fsyncs it and renames it over
    ``path``; then all ranks wait at a barrier, so when this returns the file is complete and
    visible to every rank. Other ranks write nothing (``rank0_only=False`` lets every rank write
    its own path, for per-rank state).

    Args:
        path: the ``.npz`` file to create or replace; its directory is created if needed.
        state: what to store; arrays may be NumPy or CuPy (copied to the host).
        rank0_only: only rank 0 writes (the default: DDP keeps every rank identical).

    Returns:
        The path written.

    Raises:
        TypeError: ``state`` holds something that is not data (an object, a function).
    """
    path = Path(path)
    rank, world, barrier = _dist()
    if rank == 0 or not rank0_only:
        arrays: dict[str, np.ndarray] = {}
        meta = {"format_version": FORMAT_VERSION, "state": _encode(dict(state), "", arrays)}
        if META_KEY in arrays:
            raise ValueError(f"save_checkpoint: the key {META_KEY!r} is reserved.")
        arrays[META_KEY] = np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        try:
            with open(tmp, "wb") as f:
                np.savez(f, **arrays)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            if tmp.exists():
                tmp.unlink()
        try:  # make the rename itself durable
            dir_fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError:
            pass
        log.info("checkpoint written: %s (%d arrays)", path, len(arrays) - 1)
    if world > 1:
        barrier()
    return path


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint`; arrays come back as NumPy arrays.

    Raises:
        CheckpointError: the file is missing, truncated, not a checkpoint, or from a newer format.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{rank_prefix()} load_checkpoint: {path} does not exist. Pass an "
                              "existing file, or use latest_checkpoint(dir) to find one.")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (zipfile.BadZipFile, ValueError, EOFError, OSError, KeyError) as e:
        raise CheckpointError(f"{rank_prefix()} load_checkpoint: {path} is not a readable "
                              f"checkpoint ({type(e).__name__}: {e}); it may be truncated by a "
                              "crash or not written by minidist. Delete it and resume from an "
                              "earlier checkpoint.") from e
    if META_KEY not in arrays:
        raise CheckpointError(f"{rank_prefix()} load_checkpoint: {path} has no {META_KEY} entry, "
                              "so it is an .npz file but not a minidist checkpoint.")
    try:
        meta = json.load(io.BytesIO(arrays.pop(META_KEY).tobytes()))
    except ValueError as e:
        raise CheckpointError(f"{rank_prefix()} load_checkpoint: {path} has corrupt metadata "
                              f"({e}). Delete it and resume from an earlier checkpoint.") from e
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(f"{rank_prefix()} load_checkpoint: {path} has format version "
                              f"{version}, this minidist reads version {FORMAT_VERSION}.")
    try:
        return _decode(meta["state"], arrays)
    except KeyError as e:
        raise CheckpointError(f"{rank_prefix()} load_checkpoint: {path} refers to array {e} "
                              "that is not in the file; the file is damaged.") from e


def latest_checkpoint(directory: str | Path) -> Path | None:
    """The newest ``checkpoint-NNNNNN.npz`` in ``directory`` (highest number), or None."""
    directory = Path(directory)
    if not directory.is_dir():
        return None
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME_RE.match(p.name))]
    return max(found)[1] if found else None


def check_state_dict(expected: Mapping[str, Any], loaded: Mapping[str, Any], what: str,
                     source: str | Path) -> None:
    """Raise CheckpointError if ``loaded`` does not have exactly ``expected``'s keys and shapes.

    Called BEFORE anything is loaded, so a mismatched checkpoint changes nothing.

    Args:
        expected: the live state dict (name -> array) of the model being restored.
        loaded: the state dict read from the checkpoint.
        what: what is being restored, for the message (``"model"``).
        source: the checkpoint file, for the message.
    """
    missing = [k for k in expected if k not in loaded]
    unexpected = [k for k in loaded if k not in expected]
    if missing or unexpected:
        raise CheckpointError(
            f"{rank_prefix()} load {what} from {source}: keys differ; missing from the "
            f"checkpoint: {missing[:5]}{'...' if len(missing) > 5 else ''}, unexpected: "
            f"{unexpected[:5]}{'...' if len(unexpected) > 5 else ''}. The checkpoint was written "
            "for a different model; build the same model (same layers and sizes) to resume.")
    for k, v in expected.items():
        got = np.shape(loaded[k])
        if tuple(got) != tuple(np.shape(v)):
            raise CheckpointError(
                f"{rank_prefix()} load {what} from {source}: {k!r} has shape {tuple(got)} in the "
                f"checkpoint but {tuple(np.shape(v))} in the {what}. Build the same model (same "
                "layer sizes) to resume.")
