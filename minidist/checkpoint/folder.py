"""The checkpoint folder: file names, listing newest first, and stale temporary files.

    checkpoint_path("runs/a", 4)       # runs/a/checkpoint-000004.npz
    list_checkpoints("runs/a")         # [.../checkpoint-000004.npz, .../checkpoint-000003.npz, ...]
    temp_path(path)                    # .checkpoint-000004.npz.tmp-<host>-<pid>, beside it
    remove_stale_temp_files("runs/a")  # what a crashed writer left behind
"""

from __future__ import annotations

import os
import re
import socket
import time
from pathlib import Path

from minidist.logger import get_logger

log = get_logger(__name__)

_NAME_RE = re.compile(r"^checkpoint-(\d+)\.npz$")
# ".checkpoint-000004.npz.tmp-<host>-<pid>" (files from before the host was added: "tmp-<pid>")
_TEMP_RE = re.compile(r"^\.(?P<target>.+)\.tmp-(?:(?P<host>.+)-)?(?P<pid>\d+)$")
# A temporary file this old is stale even if a process with its writer's pid runs (pids are
# reused; another host's pids cannot be checked). Writing one checkpoint takes seconds.
STALE_TEMP_AGE_S = 3600.0


def checkpoint_path(directory: str | Path, epoch: int) -> Path:
    """The file name of the checkpoint written after ``epoch`` epochs: ``checkpoint-000004.npz``."""
    return Path(directory) / f"checkpoint-{int(epoch):06d}.npz"


def temp_path(path: Path) -> Path:
    """Where this process writes ``path`` before renaming it into place (same directory)."""
    return path.with_name(f".{path.name}.tmp-{socket.gethostname()}-{os.getpid()}")


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
