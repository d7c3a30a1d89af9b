"""Resume: which checkpoint every rank loads, and how a Trainer's state is restored from it.

    chosen = agree_on_checkpoint("runs/exp1", rank, world_size)   # COLLECTIVE
    if chosen is not None:
        path, ckpt = chosen                                         # the same file everywhere
        restore(ckpt, path, world_size, model, optimizer, scheduler, scaler, log)

How the ranks agree (rank 0 picks, everyone loads the same file or everyone raises)::

    rank 0: remove stale temp files; try checkpoint-N, N-1, ... until one loads
            (each one skipped: one warning line naming it and why); once one loads, the
            damaged ones skipped are renamed checkpoint-N.npz.damaged: kept for inspection,
            never overwritten by the resumed run
    broadcast {path, error} from rank 0                -> the same choice everywhere
    ranks 1..N-1 load that path; all_gather who failed -> the same error everywhere

``restore`` checks before it changes anything: the world size the checkpoint was written at,
and that the model's state dict fits; then it loads model, optimizer, the scheduler's
position, the GradScaler and the random generator.
"""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path
from typing import Any, Callable

from minidist import comm
from minidist.checkpoint.errors import CheckpointError
from minidist.checkpoint.folder import list_checkpoints, remove_stale_temp_files
from minidist.checkpoint.store import check_state_dict, load_checkpoint
from minidist.logger import get_logger, rank_prefix
from minidist.tensor import random as tensor_random

log = get_logger("minidist.trainer")  # resume is the Trainer's: its log lines keep that name

# The entries a Trainer checkpoint has (a checkpoint without them was written by someone else)
RESUME_KEYS = ("model", "optimizer", "epoch", "global_step", "world_size", "rng")


def pick_checkpoint(directory: str | Path) -> tuple[dict | None, dict]:
    """Rank 0: (the newest loadable Trainer checkpoint, ``{"path", "error"}`` for the others)."""
    remove_stale_temp_files(directory)
    skipped = []
    damaged: list[Path] = []
    for candidate in list_checkpoints(directory):
        try:
            loaded = load_checkpoint(candidate)
        except CheckpointError as e:
            why = e.reason
            damaged.append(candidate)
        else:
            missing = [k for k in RESUME_KEYS if k not in loaded]
            if not missing:
                for path in damaged:  # the resumed run would write these names again
                    aside = set_aside(path)
                    if aside is not None:
                        log.warning("resume: set the damaged %s aside as %s (kept for "
                                    "inspection)", path.name, aside)
                return loaded, {"path": str(candidate), "error": None}
            why = f"it has no {missing[0]!r} entry, so Trainer did not write it"
        skipped.append(f"{candidate.name} ({why})")
        log.warning("resume: skipped %s: %s", candidate, why)
    error = (f"resume: none of the {len(skipped)} checkpoints in {directory} loads: "
             f"{'; '.join(skipped)}. Restore a copy, or move them aside to start fresh."
             if skipped else None)
    return None, {"path": None, "error": error}


def set_aside(path: Path) -> Path | None:
    """Rename a damaged checkpoint to ``<name>.damaged`` (``.damaged-2``, ... if taken): kept
    for inspection, out of the resumed run's way (it would write the same name again), and
    no longer listed as a checkpoint. None if it cannot be renamed (it stays where it is)."""
    for k in range(1, 100):
        aside = path.with_name(f"{path.name}.damaged" + (f"-{k}" if k > 1 else ""))
        if aside.exists():
            continue
        try:
            os.rename(path, aside)
        except OSError as e:
            log.warning("resume: could not set the damaged %s aside (%s); the run may write "
                        "over it", path, e)
            return None
        return aside
    return None


def check_writable(directory: str | Path, rank: int, world_size: int) -> None:
    """Before the first step: rank 0 (the writer) creates ``directory`` if needed and writes
    and removes a probe file there, so an unwritable checkpoint_dir is found at the start, not
    at the first save after an epoch of training. COLLECTIVE when ``world_size > 1``.

    Raises:
        CheckpointError: on every rank alike, naming the folder and why it cannot be written.
    """
    why: str | None = None
    if rank == 0:
        probe = Path(directory) / f".write-probe-{socket.gethostname()}-{os.getpid()}"
        try:
            Path(directory).mkdir(parents=True, exist_ok=True)
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            name = errno.errorcode.get(e.errno or 0, type(e).__name__)
            why = f"{name}: {e.strerror or e}"
    if world_size > 1:
        why = comm.broadcast_object(why, src=0)
    if why is not None:
        raise CheckpointError(
            f"{rank_prefix()} checkpoint_dir {directory} cannot be written ({why}); the first "
            "checkpoint would fail after an epoch of training. Choose a folder this job can "
            "write (examples/train.py: --checkpoint-dir), or free space on its disk.",
            path=Path(directory), reason=why)


def agree_on_checkpoint(directory: str | Path, rank: int, world_size: int
                        ) -> tuple[Path, dict] | None:
    """Rank 0 picks the newest checkpoint that loads; every rank then loads that one.

    COLLECTIVE over the default group (when ``world_size > 1``). Returns ``(path, state)``, or
    None when the folder holds no checkpoint.

    Raises:
        CheckpointError: on every rank alike: no checkpoint loads, or a rank cannot read the
            one rank 0 chose.
    """
    choice: dict = {"path": None, "error": None}
    ckpt: dict | None = None
    unexpected: Exception | None = None
    if rank == 0:
        try:
            ckpt, choice = pick_checkpoint(str(directory))
        except Exception as e:  # noqa: BLE001 - told to the other ranks, then raised here
            choice["error"], unexpected = f"resume: {type(e).__name__}: {e}", e
    if world_size > 1:
        choice = comm.broadcast_object(choice, src=0)
    if unexpected is not None:
        raise unexpected
    if choice["error"]:
        raise CheckpointError(f"{rank_prefix()} {choice['error']}")
    if choice["path"] is None:
        return None
    path, failed = Path(choice["path"]), None
    if ckpt is None:  # the other ranks read the file rank 0 chose
        try:
            ckpt = load_checkpoint(path)
        except CheckpointError as e:
            failed = e.reason
    if world_size > 1:
        failures = [(r, f) for r, f in enumerate(comm.all_gather_object(failed)) if f]
        if failures:
            r, why = failures[0]
            raise CheckpointError(
                f"{rank_prefix()} resume from {path}: rank 0 read it but rank {r} cannot "
                f"({why}). Every rank must see the same checkpoint_dir (a shared file "
                "system, or the same copy on every node).")
    assert ckpt is not None, "every rank loaded the checkpoint or raised above"
    return path, ckpt


def no_checkpoint_error(directory: str | Path) -> CheckpointError:
    """``resume=True`` found nothing to resume: most often a mistyped folder name."""
    where = ("does not exist" if not Path(directory).is_dir() else
             "holds no checkpoint-NNNNNN.npz")
    return CheckpointError(
        f"{rank_prefix()} resume: {directory} {where}, so there is nothing to resume. Check "
        "the folder name; to start fresh when there is no checkpoint yet (a job that is "
        "resubmitted with the same command), use resume='if_present' (examples/train.py: "
        "--resume-if-present).")


def refuse_used_folder(directory: str | Path, rank: int, world_size: int) -> None:
    """A new run (not a resume) must not write into a folder that holds another run's
    checkpoints: the two would mix, and a later resume takes the newest file whichever run
    wrote it. COLLECTIVE when ``world_size > 1`` (rank 0 looks, every rank raises alike).

    Raises:
        CheckpointError: ``directory`` holds ``checkpoint-NNNNNN.npz`` files.
    """
    found: list | None = None
    if rank == 0:
        names = [p.name for p in list_checkpoints(directory)]
        found = [len(names), names[0]] if names else None
    if world_size > 1:
        found = comm.broadcast_object(found, src=0)
    if found:
        raise CheckpointError(
            f"{rank_prefix()} checkpoint_dir {directory} already holds {found[0]} "
            f"checkpoint(s) of an earlier run (newest {found[1]}), maybe of another model. "
            "A new run there would mix the two runs. Choose a folder per run (examples/"
            "train.py: --checkpoint-dir runs/<name>), continue that run with resume=True "
            "(--resume), or delete its checkpoints to start over.")


def restore(ckpt: dict, path: Path, world_size: int, model: Any, optimizer: Any,
            scheduler: Any, scaler: Any, note: Callable[[str], None]) -> None:
    """Load a Trainer checkpoint into model, optimizer, scheduler, scaler and the generator.

    Checks first (nothing is changed if a check fails); ``note`` gets rank-0 messages.

    Raises:
        CheckpointError: written at another world size, or the model or optimizer differ.
    """
    if int(ckpt["world_size"]) != world_size:
        raise CheckpointError(
            f"{rank_prefix()} resume from {path}: written at world size {ckpt['world_size']}"
            f", resuming at {world_size}. The data order and the learning-rate schedule "
            "depend on it; resume with the same number of ranks (-n), or start a new run.")
    check_state_dict(model.state_dict(), ckpt["model"], "model", path)
    # Everything checked: now load (nothing was changed before this point).
    model.load_state_dict(ckpt["model"])
    try:
        optimizer.load_state_dict(ckpt["optimizer"])
    except (ValueError, KeyError) as e:
        raise CheckpointError(f"{rank_prefix()} resume from {path}: optimizer state does "
                              f"not fit this optimizer ({e}). Build the same optimizer "
                              "(type and parameter groups) to resume.") from e
    if scheduler is not None and ckpt.get("scheduler") is not None:
        # Only the position: the shape (warm-up, total steps, min_lr) is this run's config,
        # so a resumed run given more epochs decays over the new total.
        scheduler.load_state_dict({k: v for k, v in ckpt["scheduler"].items()
                                   if k in ("last_epoch", "base_lrs", "_last_lr")})
    if scaler.is_enabled():
        if ckpt.get("scaler"):
            scaler.load_state_dict(ckpt["scaler"])
        else:
            note(f"resume: {path} has no GradScaler state (saved without amp); the "
                 "loss scale starts fresh")
    tensor_random.default_generator().bit_generator.state = ckpt["rng"]


__all__ = ["RESUME_KEYS", "agree_on_checkpoint", "check_writable", "no_checkpoint_error",
           "pick_checkpoint", "refuse_used_folder", "restore", "set_aside"]
