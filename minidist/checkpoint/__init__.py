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

The package, one concept per module (each imports only those above it):

    errors.py     CheckpointError
    codec.py      state tree <-> JSON + named arrays (lossless: int keys, tuples, NumPy scalars)
    folder.py     file names, listing, stale temporary files
    integrity.py  the CRC-32 trailer, the non-finite check, the messages for damaged files
    store.py      save_checkpoint, load_checkpoint, prune_checkpoints, check_state_dict
    safe_globals.py  torch.serialization's allow-list (safe_globals, add_safe_globals)
    pickled.py    whole objects (a Module, a dataclass config) pickled for save; load
                  unpickles allow-listed classes only, unless weights_only=False
    serialize.py  save, load: torch.save/torch.load for state dicts, NOT collective
    resume.py     which checkpoint every rank resumes from (collective), and the Trainer's
                  restore from it
    history.py    History, the per-epoch metrics a checkpoint carries
    trainer_config.py  TrainerConfig (minidist/trainer.py is a module: its parts live here)
    trainer_checks.py  the Trainer's amp, float16 and pre-flight checks (a base class)
    trainer_report.py  the Trainer's log lines, progress bar and merged trace (a base class)
"""

from minidist.checkpoint.codec import FORMAT_VERSION, META_KEY
from minidist.checkpoint.errors import CheckpointError
from minidist.checkpoint.folder import (STALE_TEMP_AGE_S, checkpoint_path, latest_checkpoint,
                                        list_checkpoints, remove_stale_temp_files)
from minidist.checkpoint.integrity import TRAILER_NBYTES, TRAILER_TAG
from minidist.checkpoint.serialize import load, save
from minidist.checkpoint.store import (check_state_dict, load_checkpoint, prune_checkpoints,
                                       save_checkpoint)

__all__ = ["CheckpointError", "FORMAT_VERSION", "META_KEY", "STALE_TEMP_AGE_S", "TRAILER_NBYTES",
           "TRAILER_TAG", "check_state_dict", "checkpoint_path", "latest_checkpoint",
           "list_checkpoints", "load_checkpoint", "prune_checkpoints", "remove_stale_temp_files",
           "save_checkpoint", "save", "load"]
