"""Integrity: the CRC-32 trailer over the whole file, the non-finite check, damage messages.

    with open(tmp, "w+b") as f:
        np.savez(f, **arrays)
        append_trailer(f)          # the zip comment becomes "minidist-crc32:<8 hex digits>"
    check_trailer(path)            # True (matches), False (no trailer), or CheckpointError
    first_nonfinite(arrays)        # None, or where the first NaN/inf is
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from minidist.checkpoint.errors import CheckpointError
from minidist.checkpoint.folder import latest_checkpoint
from minidist.logger import rank_prefix

# CRC-32 finds every change of up to 32 consecutive bits (so every changed byte, for sure) and
# is faster than SHA-256: it guards against accidents, not against attacks.
TRAILER_TAG = b"minidist-crc32:"
TRAILER_NBYTES = len(TRAILER_TAG) + 8  # the tag and 8 hex digits: the zip archive's comment
_EOCD = b"PK\x05\x06"  # zip "end of central directory" record, 22 bytes + the comment
_EOCD_NBYTES = 22
_CHUNK = 1 << 20


def first_nonfinite(arrays: Mapping[str, np.ndarray]) -> tuple[str, int, Any, Any, int] | None:
    """(key, count, value, index, other arrays) of the first array holding NaN/inf, or None."""
    bad = [k for k, a in arrays.items() if a.dtype.kind in "fc" and not np.isfinite(a).all()]
    if not bad:
        return None
    a = arrays[bad[0]]
    mask = ~np.isfinite(a)
    index = tuple(int(i) for i in np.argwhere(mask)[0]) if a.ndim else ()
    return bad[0], int(mask.sum()), a[index], index, len(bad) - 1


def nonfinite_error(path: Path, state: Mapping[str, Any], arrays: Mapping[str, np.ndarray],
                    found: tuple) -> CheckpointError:
    """The refusal for ``found`` (from :func:`first_nonfinite`): array, epoch, last good file."""
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


def append_trailer(f: Any) -> None:
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


def check_trailer(path: Path) -> bool:
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
        raise damaged(path, f"its CRC-32 is {actual} but it was written with {expected}, so "
                             "bytes changed after it was written")
    return True


def damaged(path: Path, reason: str) -> CheckpointError:
    """The error for a file that cannot be read as a checkpoint, ``reason`` saying why."""
    return CheckpointError(
        f"{rank_prefix()} load_checkpoint: {path} is not a readable checkpoint: {reason}. It "
        "may be truncated by a crash or a full disk, damaged in a copy, or not written by "
        "minidist. Move it aside and resume from an earlier checkpoint (Trainer(resume=True) "
        "skips damaged ones by itself).", path=path, reason=reason)
