"""Atomic, self-checking training checkpoints stored as data (npz + JSON), never as pickles.

    from minidist.checkpoint import save_checkpoint, load_checkpoint, latest_checkpoint
    save_checkpoint(path, {"model": model.state_dict(), "optimizer": opt.state_dict(),
                           "epoch": 3, "global_step": 420}, keep_last=3)   # rank 0 writes
    ckpt = load_checkpoint(latest_checkpoint("runs/exp1"))             # any rank reads
    model.load_state_dict(ckpt["model"])

One checkpoint is ONE ``.npz`` file (a zip archive), loaded with ``allow_pickle=False``:

    checkpoint-000004.npz
    |-- __meta__.json        JSON tree of everything that is not an array (as uint8 bytes);
    |                        arrays appear in it as {"__array__": "<key>"}
    |-- model/fc1.weight     every array, under its path in the state tree
    |-- optimizer/state/0/momentum_buffer
    |-- ...
    '-- zip comment: "minidist-crc32:<8 hex digits>", the CRC-32 of every byte before it

Writing is crash-safe: the writer (rank 0) writes a temporary file in the same directory
(``.checkpoint-000004.npz.tmp-<host>-<pid>``), fsyncs it, then ``os.replace`` puts it in place
in one step (a reader sees the old file or the new one, never half of one). Temporary files
left by a crashed writer are removed at the next save (and at resume) once their writer is no
longer running or they are older than ``STALE_TEMP_AGE_S``.

What can go wrong, and what happens:

    non-finite values  save refuses (CheckpointError naming the array, epoch, last good file);
                       nothing is written, so the newest checkpoint stays the last good one
    any changed byte   load raises CheckpointError naming the file: the CRC-32 trailer covers
                       the whole file (zip's own CRC-32s cover only each member's bytes)
    several ranks      the writer broadcasts the outcome, so every rank returns or raises the
                       same error; nobody waits for a rank that failed
    a full folder      keep_last=N deletes all but the N newest (never the newest good one)

Nested state is encoded losslessly: dicts with non-string keys (torch's optimizer state is
keyed by parameter index), tuples, NumPy scalars (kept as 0-d arrays, so float32 stays float32)
and big integers (PCG64 RNG states) all come back as they went in.
"""

from __future__ import annotations

import builtins
import io
import json
import os
import re
import socket
import time
import zlib
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from minidist import xp as backend
from minidist.log import get_logger, rank_prefix

log = get_logger(__name__)

META_KEY = "__meta__.json"
FORMAT_VERSION = 1
_NAME_RE = re.compile(r"^checkpoint-(\d+)\.npz$")
# ".checkpoint-000004.npz.tmp-<host>-<pid>" (files from before the host was added: "tmp-<pid>")
_TEMP_RE = re.compile(r"^\.(?P<target>.+)\.tmp-(?:(?P<host>.+)-)?(?P<pid>\d+)$")
# A temporary file this old is stale even if a process with its writer's pid runs (pids are
# reused; another host's pids cannot be checked). Writing one checkpoint takes seconds.
STALE_TEMP_AGE_S = 3600.0
# CRC-32 finds every change of up to 32 consecutive bits (so every changed byte, for sure) and
# is several times faster than SHA-256: it guards against accidents, not against attacks.
TRAILER_TAG = b"minidist-crc32:"
TRAILER_NBYTES = len(TRAILER_TAG) + 8  # the tag and 8 hex digits: the zip archive's comment
_EOCD = b"PK\x05\x06"  # zip "end of central directory" record, 22 bytes + the comment
_EOCD_NBYTES = 22
_CHUNK = 1 << 20


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read, or does not match what it is loaded into.

    Attributes:
        path: the file concerned (None if not about one file).
        reason: the problem in a few words, without the advice (resume prints it when it
            skips a damaged checkpoint).
    """

    def __init__(self, message: str, *, path: str | Path | None = None,
                 reason: str | None = None) -> None:
        super().__init__(message)
        self.path = None if path is None else Path(path)
        self.reason = reason or message


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


# ----------------------------------------------------------------------------- integrity


def _first_nonfinite(arrays: Mapping[str, np.ndarray]) -> tuple[str, int, Any, Any, int] | None:
    """(key, count, value, index, other arrays) of the first array holding NaN/inf, or None."""
    bad = [k for k, a in arrays.items() if a.dtype.kind in "fc" and not np.isfinite(a).all()]
    if not bad:
        return None
    a = arrays[bad[0]]
    mask = ~np.isfinite(a)
    index = tuple(int(i) for i in np.argwhere(mask)[0]) if a.ndim else ()
    return bad[0], int(mask.sum()), a[index], index, len(bad) - 1


def _nonfinite_error(path: Path, state: Mapping[str, Any], arrays: Mapping[str, np.ndarray],
                     found: tuple) -> CheckpointError:
    key, count, value, index, others = found
    where = f" at index {index}" if index else ""
    more = f"; {others} more array(s) hold non-finite values too" if others else ""
    epoch = state.get("epoch")
    when = f" after epoch {epoch}" if isinstance(epoch, (int, np.integer)) else ""
    last = latest_checkpoint(path.parent)
    if last is not None:
        keep = (f"nothing was written, and the last good checkpoint, {last}, is kept. Resuming "
                "from it would repeat the same steps (resume is exact), so start again with a "
                "lower learning rate or gradient clipping (optim.clip_grad_norm_), or load its "
                "weights into a new run")
    else:
        keep = (f"nothing was written (there is no earlier checkpoint in {path.parent}). Start "
                "again with a lower learning rate or gradient clipping (optim.clip_grad_norm_)")
    reason = f"{key!r} holds {count} non-finite value(s) (first: {value}{where}){when}{more}"
    return CheckpointError(
        f"{rank_prefix()} save_checkpoint: refused to write {path.name}: {reason}. The run "
        f"diverged: {keep}. To store non-finite values on purpose, pass allow_nonfinite=True.",
        path=path, reason=reason)


def _crc32(f: Any, nbytes: int) -> str:
    """CRC-32 (8 hex digits) of the first ``nbytes`` bytes of the open binary file ``f``."""
    crc = 0
    f.seek(0)
    left = nbytes
    while left > 0:
        chunk = f.read(min(_CHUNK, left))
        if not chunk:
            break
        crc = zlib.crc32(chunk, crc)
        left -= len(chunk)
    return f"{crc:08x}"


def _append_trailer(f: Any) -> None:
    """Make the CRC-32 of the whole zip archive its comment (zip readers ignore comments).

    The comment length in the end record is set first, so the checksum covers it as well:
    a changed byte anywhere in the file, the trailer included, fails the check in
    :func:`load_checkpoint`.
    """
    size = f.seek(0, os.SEEK_END)
    f.seek(size - _EOCD_NBYTES)
    end = f.read(_EOCD_NBYTES)
    assert end[:4] == _EOCD and end[20:22] == b"\0\0", f"unexpected zip end record {end!r}"
    f.seek(size - 2)
    f.write(TRAILER_NBYTES.to_bytes(2, "little"))
    f.flush()
    digest = _crc32(f, size)
    f.seek(size)
    f.write(TRAILER_TAG + digest.encode("ascii"))


def _check_trailer(path: Path) -> bool:
    """True if ``path`` ends in a CRC-32 trailer that matches; False if it has none.

    Raises:
        CheckpointError: the trailer does not match the bytes before it.
    """
    size = path.stat().st_size
    if size < _EOCD_NBYTES + TRAILER_NBYTES:
        return False
    with open(path, "rb") as f:
        f.seek(size - TRAILER_NBYTES)
        trailer = f.read()
        if not trailer.startswith(TRAILER_TAG):
            return False
        expected = trailer[len(TRAILER_TAG):].decode("ascii", "replace")
        actual = _crc32(f, size - TRAILER_NBYTES)
    if actual != expected:
        raise _damaged(path, f"its CRC-32 is {actual} but it was written with {expected}, so "
                             "bytes changed after it was written")
    return True


def _damaged(path: Path, reason: str) -> CheckpointError:
    return CheckpointError(
        f"{rank_prefix()} load_checkpoint: {path} is not a readable checkpoint: {reason}. It "
        "may be truncated by a crash or a full disk, damaged in a copy, or not written by "
        "minidist. Move it aside and resume from an earlier checkpoint (Trainer(resume=True) "
        "skips damaged ones by itself).", path=path, reason=reason)


# ----------------------------------------------------------------------------- folder upkeep


def _numbered(directory: Path) -> list[tuple[int, Path]]:
    """``(epoch, path)`` of every ``checkpoint-NNNNNN.npz`` in ``directory``, newest first."""
    if not directory.is_dir():
        return []
    return sorted(((int(m.group(1)), p) for p in directory.iterdir()
                   if (m := _NAME_RE.match(p.name))), reverse=True)


def list_checkpoints(directory: str | Path) -> list[Path]:
    """Every ``checkpoint-NNNNNN.npz`` in ``directory``, newest (highest number) first."""
    return [p for _, p in _numbered(Path(directory))]


def latest_checkpoint(directory: str | Path) -> Path | None:
    """The newest ``checkpoint-NNNNNN.npz`` in ``directory`` (highest number), or None.

    It is not opened: see ``Trainer(resume=True)`` for a resume that skips damaged files.
    """
    found = list_checkpoints(directory)
    return found[0] if found else None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    except (OverflowError, ValueError):
        return False
    return True


def remove_stale_temp_files(directory: str | Path,
                            max_age_s: float = STALE_TEMP_AGE_S) -> list[Path]:
    """Delete temporary checkpoint files that a crashed writer left in ``directory``.

    A file ``.<name>.tmp-<host>-<pid>`` is stale when its writer is gone (this host, no
    process ``pid``) or it is older than ``max_age_s`` (another host, or a reused pid). A
    running writer's file is never touched. Called by :func:`save_checkpoint` and at resume.

    Returns:
        The files removed (each is also logged as a warning).
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    here, now, removed = socket.gethostname(), time.time(), []
    for p in directory.iterdir():
        m = _TEMP_RE.match(p.name)
        if m is None or not _NAME_RE.match(m.group("target")):
            continue
        pid, host = int(m.group("pid")), m.group("host") or here
        try:
            age_s = now - p.stat().st_mtime
        except FileNotFoundError:  # its writer just renamed it into place
            continue
        if host == here and pid != os.getpid() and not _pid_alive(pid):
            why = f"its writer, pid {pid}, is no longer running"
        elif age_s > max_age_s:
            why = f"it is {age_s / 3600:.1f} h old"
        else:
            continue
        p.unlink(missing_ok=True)
        removed.append(p)
        log.warning("removed the stale temporary checkpoint %s (%s; a crash left it)", p, why)
    return removed


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


# ----------------------------------------------------------------------------- write / read


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
            "state": _encode(dict(state), "", arrays)}
    if META_KEY in arrays:
        raise ValueError(f"{rank_prefix()} save_checkpoint: the key {META_KEY!r} is reserved.")
    found = None if allow_nonfinite else _first_nonfinite(arrays)
    if found is not None:
        raise _nonfinite_error(path, state, arrays, found)
    arrays[META_KEY] = np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temp_files(path.parent)
    tmp = path.with_name(f".{path.name}.tmp-{socket.gethostname()}-{os.getpid()}")
    try:
        with open(tmp, "w+b") as f:
            np.savez(f, **arrays)
            _append_trailer(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    try:  # make the rename itself durable
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass
    return len(arrays) - 1


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

    Rank 0 checks the arrays (no NaN/inf), writes a temporary file in the same directory,
    fsyncs it and renames it over ``path``, then prunes old checkpoints (``keep_last``).
    Then it broadcasts the outcome: every rank returns once the file is complete and visible,
    or every rank raises the same error (so a refused save never leaves a rank waiting).
    ``rank0_only=False`` lets every rank write its own path (for per-rank state); then any
    rank's failure is raised on all.

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
        has_trailer = _check_trailer(path)
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
        return _decode(meta["state"], arrays)
    except CheckpointError:
        raise
    except Exception as e:  # noqa: BLE001 - zip, npy and JSON parsers raise many types
        reason = (f"array {e} is missing" if isinstance(e, KeyError) else
                  f"{type(e).__name__}: {e}" if str(e) else f"{type(e).__name__} while reading it")
        raise _damaged(path, reason) from e


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
