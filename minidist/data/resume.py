"""Where a sampler and a loader stand, for a checkpoint: a run stopped mid-epoch resumes exactly.

    state = loader.state_dict()                 # saved with the model, mid-epoch
    loader.load_state_dict(state)               # later, in a fresh process
    for batch in loader: ...                    # the rest of that epoch

``DataLoader`` (``minidist/data/loader.py``) inherits ``LoaderState``; the sampler's part is
``DistributedSampler.state_dict``. The Trainer's checkpoints save both.

The same position tells the ranks' training steps apart: ``batch_position()`` is the batch a
loader with a ``DistributedSampler`` handed out last in this thread. Every rank hands out its
shard's batches in step, so the watch wing puts the position into the label of DDP's bucket
all-reduces (minidist/watch/step_labels.py), and a rank that skipped or repeated a step fails
at its next bucket, before any wrong average is returned.
"""

from __future__ import annotations

import threading
from typing import Any

class Pass:
    """One running pass of a DistributedSampler-fed loader: the batch it handed out last."""

    __slots__ = ("position",)

    def __init__(self) -> None:
        self.position: tuple[int, int] | None = None  # (epoch, batch index)


class _Running(threading.local):
    def __init__(self) -> None:
        self.passes: list[Pass] = []  # this thread's running passes, the newest last


_RUNNING = _Running()  # per thread (thread ranks)


def batch_position() -> tuple[int, int] | None:
    """``(epoch, batch index)`` of the batch the newest running pass of a DistributedSampler-fed
    loader handed out last in this thread (an inner pass's end gives back the outer one's, in
    whatever order passes end: ``zip(loader_a, loader_b)``); None outside any such pass."""
    return _RUNNING.passes[-1].position if _RUNNING.passes else None


def pass_started() -> Pass:
    """A new pass of this thread (``DataLoader._batches``); ``pass_ended`` when it ends."""
    running = Pass()
    _RUNNING.passes.append(running)
    return running


def pass_ended(running: Pass) -> None:
    """``running`` ended (finished, left early or dropped): it no longer counts."""
    _RUNNING.passes[:] = [p for p in _RUNNING.passes if p is not running]


class LoaderState:
    """``DataLoader``'s checkpoint methods (its position: ``_pass_epoch``, ``_yielded``,
    ``_resume_at``, kept by ``DataLoader._batches``)."""


    def state_dict(self: Any) -> dict[str, Any]:
        """Where iteration stands: ``{"epoch", "batches_yielded", "seed", "sampler"}``.

        ``epoch`` is the pass in progress and ``batches_yielded`` how many of its batches were
        handed out (0 between passes). After ``load_state_dict`` the next pass is that epoch
        again, starting at the next batch, so a run stopped mid-epoch resumes exactly:

            state = loader.state_dict()                 # saved with the model, mid-epoch
            loader.load_state_dict(state)               # later, in a fresh process
            for batch in loader: ...                    # the rest of that epoch
        """
        epoch, done = self._pass_epoch, self._yielded
        if done >= len(self):  # the last batch was handed out: the pass is over
            epoch, done = epoch + 1, 0
        return {"epoch": epoch, "batches_yielded": done, "seed": self.seed,
                "sampler": self.sampler.state_dict() if hasattr(self.sampler, "state_dict")
                else None}

    def load_state_dict(self: Any, state: dict[str, Any]) -> None:
        """Resume at ``state``: the next pass is epoch ``state["epoch"]`` from the next batch.

        Raises:
            ValueError: another seed, or a sampler state that does not fit (see
                ``DistributedSampler.load_state_dict``).
        """
        if int(state["seed"]) != self.seed:
            raise ValueError(f"DataLoader.load_state_dict: saved seed={state['seed']} but this "
                             f"loader has seed={self.seed}. Build it with the saved seed.")
        if state.get("sampler") is not None and hasattr(self.sampler, "load_state_dict"):
            self.sampler.load_state_dict(state["sampler"])
        self.set_epoch(int(state["epoch"]))
        self._resume_at = int(state["batches_yielded"])
        self._pass_epoch, self._yielded = self.epoch, self._resume_at

    @property
    def resume_at(self: Any) -> int:
        """The batch the next pass starts at (0 unless a mid-epoch state was loaded)."""
        return self._resume_at
