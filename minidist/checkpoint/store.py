"""Writing and reading one checkpoint, and keeping the folder to the newest N.

    save_checkpoint(path, state, keep_last=3)   # rank 0 writes; every rank learns the outcome
    state = load_checkpoint(path)               # CheckpointError for any damaged file
    prune_checkpoints("runs/a", keep_last=3)    # never deletes the newest good one

save_checkpoint, on the writing rank::

    encode the state -> refuse NaN/inf -> remove stale temp files -> write the temp file
    -> append the CRC-32 trailer -> fsync -> os.replace onto path -> fsync the directory
    -> prune (keep_last) -> broadcast the outcome (None, or the error) to every rank
"""

from __future__ import annotations

import builtins
import errno
import io
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from minidist.checkpoint.codec import FORMAT_VERSION, META_KEY, decode, encode
from minidist.checkpoint.errors import CheckpointError
from minidist.checkpoint.folder import list_checkpoints, remove_stale_temp_files, temp_path
from minidist.checkpoint.integrity import (append_trailer, check_trailer, damaged,
                                           first_nonfinite, nonfinite_error)
from minidist.logger import get_logger, rank_prefix

log = get_logger(__name__)


def _dist() -> tuple[int, int, Any]:
    """(rank, world_size, comm module) of the default process group; (0, 1, None) without."""
    try:
        from minidist import comm
        if comm.is_initialized():
            return comm.get_rank(), comm.get_world_size(), comm
    except (ImportError, AttributeError):
        pass
    return 0, 1, None


def _write(path: Path, state: Mapping[str, Any], allow_nonfinite: bool) -> int:
    """Encode, check and atomically write one checkpoint; returns the number of arrays."""
    arrays: dict[str, np.ndarray] = {}
    meta = {"format_version": FORMAT_VERSION, "checksum": "crc32-trailer",
            "state": encode(dict(state), "", arrays)}
    if META_KEY in arrays:
        raise ValueError(f"{rank_prefix()} save_checkpoint: the key {META_KEY!r} is reserved.")
    found = None if allow_nonfinite else first_nonfinite(arrays)
    if found is not None:
        raise nonfinite_error(path, state, arrays, found)
    arrays[META_KEY] = np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8)
    tmp = temp_path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temp_files(path.parent)
        with open(tmp, "w+b") as f:
            np.savez(f, **arrays)
            append_trailer(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:  # a full disk, a read-only file system, no permission: one error
        _discard(tmp)
        raise _write_error(path, e) from None
    except BaseException:
        _discard(tmp)
        raise
    try:  # make the rename itself durable
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass
    return len(arrays) - 1


def _discard(tmp: Path) -> None:
    """Remove a half-written temp file, if it can be (on a read-only disk it cannot)."""
    try:
        tmp.unlink(missing_ok=True)
    except OSError:
        pass


def _write_error(path: Path, e: OSError) -> CheckpointError:
    """One line for a checkpoint the disk refused, naming the cause and the fix."""
    name = errno.errorcode.get(e.errno or 0, type(e).__name__)
    fix = {errno.ENOSPC: "free space on that disk, or choose a checkpoint_dir on another one",
           errno.EDQUOT: "free space within your quota, or choose another checkpoint_dir",
           errno.EROFS: "that file system is read-only: choose a writable checkpoint_dir",
           errno.EACCES: "this process may not write there: choose a writable checkpoint_dir",
           errno.EPERM: "this process may not write there: choose a writable checkpoint_dir",
           }.get(e.errno or 0, "choose a checkpoint_dir this job can write")
    return CheckpointError(
        f"{rank_prefix()} save_checkpoint: could not write {path} ({name}: {e.strerror or e}); "
        f"nothing was written and the previous checkpoints are kept. Fix: {fix}.",
        path=path, reason=f"{name}: {e.strerror or e}")


def _outcome(error: BaseException | None, rank: int) -> dict | None:
    if error is None:
        return None
    message = re.sub(r"^\[rank \d+/\d+\] ", "", str(error))
    return {"type": type(error).__name__, "message": message, "rank": rank}


def _raise_shared(outcome: dict) -> None:
    """Raise, on a rank that did not write, the error the writing rank reported."""
    name = outcome["type"]
    cls = CheckpointError if name == "CheckpointError" else getattr(builtins, name, None)
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
        cls = CheckpointError
    raise cls(f"{rank_prefix()} {outcome['message']} (reported by rank {outcome['rank']}, "
              "which writes the checkpoint)")


def save_checkpoint(path: str | Path, state: Mapping[str, Any], *, rank0_only: bool = True,
                    keep_last: int | None = None, allow_nonfinite: bool = False) -> Path:
    """Write ``state`` (a tree of arrays, numbers, strings, lists, dicts) to ``path`` atomically.

    Collective: every rank calls it. Rank 0 checks the arrays (no NaN/inf), writes a temporary
    file in the same directory, fsyncs it and renames it over ``path``, then prunes old
    checkpoints (``keep_last``). Then it broadcasts the outcome: every rank returns once the
    file is complete and visible, or every rank raises the same error (so a refused save never
    leaves a rank waiting). ``rank0_only=False`` lets every rank write its own path (for
    per-rank state); then any rank's failure is raised on all.

    Args:
        path: the ``.npz`` file to create or replace; its directory is created if needed.
        state: what to store; arrays may be NumPy or CuPy (copied to the host).
        rank0_only: only rank 0 writes (the default: DDP keeps every rank identical).
        keep_last: afterwards delete all but this many newest ``checkpoint-NNNNNN.npz`` files
            in the directory (None: keep all); see :func:`prune_checkpoints`.
        allow_nonfinite: store NaN/inf values instead of refusing.

    Returns:
        The path written.

    Raises:
        CheckpointError: an array holds NaN or inf (nothing is written; the message names
            the array, the epoch and the last good checkpoint).
        TypeError: ``state`` holds something that is not data (an object, a function).
    """
    path = Path(path)
    if keep_last is not None:  # checked on every rank, before anything is written
        _check_keep_last(keep_last, "save_checkpoint")
        if not rank0_only:
            raise ValueError(f"{rank_prefix()} save_checkpoint: keep_last needs rank0_only=True "
                             "(one rank prunes the folder).")
    rank, world, comm = _dist()
    error: BaseException | None = None
    if rank == 0 or not rank0_only:
        try:
            n_arrays = _write(path, state, allow_nonfinite)
            if keep_last is not None:
                prune_checkpoints(path.parent, keep_last, known_good=path)
            log.info("checkpoint written: %s (%d arrays)", path, n_arrays)
        except Exception as e:  # noqa: BLE001 - reported to every rank below, then raised
            error = e
    if world > 1:
        mine = _outcome(error, rank)
        outcomes = ([comm.broadcast_object(mine, src=0)] if rank0_only
                    else comm.all_gather_object(mine))
        shared = next((o for o in outcomes if o is not None), None)
        if shared is not None and error is None:
            _raise_shared(shared)
    if error is not None:
        raise error
    return path


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint`; arrays come back as NumPy arrays.

    The whole file is checked first (its CRC-32 trailer), then every zip member's CRC-32 as
    it is read: a damaged file raises, it never loads as wrong numbers.

    Raises:
        CheckpointError: the file is missing, truncated, damaged, not a checkpoint, or from a
            newer format; the message names the file.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{rank_prefix()} load_checkpoint: {path} does not exist. Pass an "
                              "existing file, or use latest_checkpoint(dir) to find one.",
                              path=path, reason="it does not exist")
    try:
        has_trailer = check_trailer(path)
        with np.load(path, allow_pickle=False) as z:
            if META_KEY not in z.files:
                raise CheckpointError(
                    f"{rank_prefix()} load_checkpoint: {path} has no {META_KEY} entry, so it is "
                    "an .npz file but not a minidist checkpoint.", path=path,
                    reason=f"no {META_KEY} entry: not a minidist checkpoint")
            arrays = {k: z[k] for k in z.files}  # reading a member to its end checks its CRC
        meta = json.load(io.BytesIO(arrays.pop(META_KEY).tobytes()))
        if not isinstance(meta, dict):
            raise ValueError(f"{META_KEY} holds a {type(meta).__name__}, not an object")
        if meta.get("checksum") == "crc32-trailer" and not has_trailer:
            raise ValueError("its CRC-32 trailer is missing")
        if "state" not in meta:
            raise ValueError(f"{META_KEY} has no 'state' entry")
        version = meta.get("format_version")
        if version != FORMAT_VERSION:
            raise CheckpointError(f"{rank_prefix()} load_checkpoint: {path} has format version "
                                  f"{version}, this minidist reads version {FORMAT_VERSION}.",
                                  path=path, reason=f"format version {version}")
        return decode(meta["state"], arrays)
    except CheckpointError:
        raise
    except Exception as e:  # noqa: BLE001 - zip, npy and JSON parsers raise many types
        if "allow_pickle" in str(e):  # NumPy's advice would be to load it unsafely: no
            raise damaged(path, "it holds pickled Python objects, which a minidist checkpoint "
                                "never does (loading them could run any code, so it is "
                                "refused)") from None
        reason = (f"array {e} is missing" if isinstance(e, KeyError) else
                  f"{type(e).__name__}: {e}" if str(e) else f"{type(e).__name__} while reading it")
        raise damaged(path, reason) from e


def _check_keep_last(keep_last: Any, where: str) -> None:
    if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
        raise ValueError(f"{rank_prefix()} {where}: keep_last={keep_last!r}; it must be an int "
                         ">= 1 (how many of the newest checkpoints to keep).")


def _loads(path: Path) -> bool:
    try:
        load_checkpoint(path)
        return True
    except CheckpointError:
        return False


def prune_checkpoints(directory: str | Path, keep_last: int,
                      known_good: str | Path | None = None) -> list[Path]:
    """Delete all but the ``keep_last`` newest ``checkpoint-NNNNNN.npz`` files in ``directory``.

    The newest good checkpoint is never deleted: if none of the kept files loads (each is
    tried, newest first, unless ``known_good`` is among them), the newest older file that
    loads is kept too. Run it on one rank (:func:`save_checkpoint` runs it on the writer).

    Args:
        directory: the checkpoint folder.
        keep_last: how many of the newest checkpoints to keep (>= 1).
        known_good: a checkpoint known to be complete (the one just written): no need to
            read it again.

    Returns:
        The files deleted.
    """
    _check_keep_last(keep_last, "prune_checkpoints")
    found = list_checkpoints(directory)
    kept, doomed = found[:keep_last], found[keep_last:]
    good = known_good is not None and any(p.resolve() == Path(known_good).resolve() for p in kept)
    if doomed and not good and not any(_loads(p) for p in kept):
        spare = next((p for p in doomed if _loads(p)), None)
        if spare is not None:
            log.warning("prune_checkpoints: none of the %d newest checkpoints loads; keeping %s, "
                        "the newest that does", keep_last, spare)
            doomed.remove(spare)
    for p in doomed:
        p.unlink(missing_ok=True)
    if doomed:
        log.info("pruned %d old checkpoint(s) in %s (keep_last=%d)", len(doomed), directory,
                 keep_last)
    return doomed


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
