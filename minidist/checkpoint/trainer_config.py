"""TrainerConfig: what the training loop needs besides the model, loss and optimizer.

    from minidist import Trainer, TrainerConfig
    config = TrainerConfig(epochs=4, batch_size=32, amp=True, checkpoint_dir="runs/exp1")
    config.validate()            # Trainer does this too: ValueError naming the first bad field

Also here: ``TrainingDiverged`` (a step's averaged gradient held NaN/inf) and the fields every
rank must agree on (``AGREED_CONFIG``, compared by the Trainer's pre-flight check). It lives in
the training wing's package because ``minidist/trainer.py`` is a module; ``minidist.trainer``
imports it from here (``from minidist.trainer import TrainerConfig`` keeps working).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minidist.logger import rank_prefix

LR_SCALINGS = ("none", "linear", "sqrt")
SCHEDULES = ("cosine", "constant")
# TrainerConfig fields that decide how many collectives run and which samples each rank sees:
# the pre-flight check at fit compares them across ranks.
AGREED_CONFIG = ("epochs", "batch_size", "grad_accum_steps", "shuffle", "seed",
                  "stop_after_epochs", "stop_after_steps", "checkpoint_every_n_steps",
                  "validation_split", "resume")


class TrainingDiverged(FloatingPointError):
    """A training step's averaged gradient held NaN or inf (``allow_nonfinite=False``).

    Raised alike on every rank (the reduced gradients are identical everywhere); the message
    names the step, the parameters and the ranks whose forward output went non-finite first.
    """


@dataclass
class TrainerConfig:
    """Everything the training loop needs besides the model, loss and optimizer.

    Attributes:
        epochs: passes over the training set.
        batch_size: samples per micro-batch PER RANK (effective batch: batch_size x world
            size x grad_accum_steps).
        shuffle: reshuffle the training set each epoch (seed + epoch, same on every rank).
        seed: seed of the shuffle and of the validation split.
        grad_accum_steps: micro-batches per optimizer step (the first k-1 under no_sync).
        lr_scaling: multiply the optimizer's rates by the world size ("linear", Goyal et al.
            2017), its square root ("sqrt"), or leave them ("none"). The Trainer does this once,
            IN PLACE, in ``Trainer.__init__``: every ``optimizer.param_groups[i]["lr"]`` becomes
            ``lr x Trainer.lr_scale``, and rank 0 says so ("lr scaled x4 (linear, world size
            4): 0.003 -> 0.012"). Pass the rate for ONE rank's batch.
        warmup_steps: optimizer steps of linear warm-up (added to warmup_epochs' steps).
        warmup_epochs: epochs of linear warm-up (may be fractional).
        schedule: "cosine" decay to min_lr over the run after warm-up, or "constant".
        min_lr: the final rate of the cosine schedule.
        log_every_n_batches: rank 0 reports its loss every n optimizer steps (0: per epoch only).
        trace_dir: write a step timeline (Chrome trace / Perfetto JSON) per rank into this
            folder, merged into ``trace.json`` at the end of ``fit`` (minidist/tracing.py; the
            ``MINIDIST_TRACE`` variable does the same). None: no tracing.
        checkpoint_every_n_epochs: write a checkpoint every n epochs and after the last (0: never).
        checkpoint_every_n_steps: also write a checkpoint every n optimizer steps, mid-epoch
            included, with the DataLoader's position (0: never). A resumed run continues at
            the next batch and ends bit-identical to a straight one. In this mode every
            checkpoint file is numbered by optimizer step (``checkpoint-000012.npz``: after
            step 12), not by epoch.
        checkpoint_dir: where checkpoints and history.json go.
        checkpoint_keep_last: keep only this many newest checkpoints (None: keep all).
        resume: True: start from the newest checkpoint in checkpoint_dir that loads (damaged
            newer ones are skipped, one warning line each); a folder without one is an error
            (a mistyped name). "if_present": the same, but start fresh when there is none
            (a job resubmitted with the same command). False: a new run, which refuses a
            checkpoint_dir that already holds checkpoints (one folder per run).
        stop_after_epochs: end this run after this many epochs of THIS run (counted from
            where it started or resumed) although the schedule spans ``epochs``: for
            time-limited jobs that resume later (None: run all).
        stop_after_steps: end this run after this many optimizer steps of this run,
            mid-epoch if need be, after writing a checkpoint when ``checkpoint_dir`` is set
            (None: run all).
        validation_split: fraction of the training set held out when no val set is given.
        progress_bar: text bar on rank 0's stderr; None = only on a TTY and not under CI.
        verbose: rank 0 prints one line per epoch.
        amp: mixed precision: forward and loss under ``amp.autocast`` on the default device,
            loss scaling with a ``GradScaler`` (see docs/amp.md).
        allow_nonfinite: False (default): the first step whose averaged gradient holds NaN or
            inf stops ``fit`` with ``TrainingDiverged``, naming the step and the parameters
            (the run diverged: every later step would train on NaN). True: train on, as
            DistributedDataParallel's own ``nonfinite_grads`` policy says (warn once, then
            count). Under amp the GradScaler handles inf/NaN steps (it skips them).
        ddp_options: extra keyword arguments for DistributedDataParallel (bucket_cap_mb, ...).
    """

    epochs: int = 10
    batch_size: int = 32
    shuffle: bool = True
    seed: int = 0
    grad_accum_steps: int = 1
    lr_scaling: str = "none"
    warmup_steps: int = 0
    warmup_epochs: float = 0.0
    schedule: str = "constant"
    min_lr: float = 0.0
    log_every_n_batches: int = 0
    trace_dir: str | None = None
    checkpoint_every_n_epochs: int = 0
    checkpoint_every_n_steps: int = 0
    checkpoint_dir: str | None = None
    checkpoint_keep_last: int | None = None
    resume: bool | str = False
    stop_after_epochs: int | None = None
    stop_after_steps: int | None = None
    validation_split: float = 0.0
    progress_bar: bool | None = None
    verbose: bool = True
    amp: bool = False
    allow_nonfinite: bool = False
    ddp_options: dict = field(default_factory=dict)

    def validate(self) -> None:
        """Raise ValueError naming the first bad field, with the allowed values."""
        checks = [
            (self.epochs >= 1, "epochs", self.epochs, ">= 1"),
            (self.batch_size >= 1, "batch_size", self.batch_size, ">= 1"),
            (self.grad_accum_steps >= 1, "grad_accum_steps", self.grad_accum_steps, ">= 1"),
            (self.lr_scaling in LR_SCALINGS, "lr_scaling", self.lr_scaling,
             f"one of {LR_SCALINGS}"),
            (self.schedule in SCHEDULES, "schedule", self.schedule, f"one of {SCHEDULES}"),
            (self.warmup_steps >= 0 and self.warmup_epochs >= 0, "warmup_steps/warmup_epochs",
             (self.warmup_steps, self.warmup_epochs), ">= 0"),
            (self.warmup_epochs <= self.epochs, "warmup_epochs", self.warmup_epochs,
             f"<= epochs ({self.epochs}): the warm-up would never end"),
            (self.resume in (False, True, "if_present"), "resume", self.resume,
             "False, True or 'if_present'"),
            (self.stop_after_epochs is None or self.stop_after_epochs >= 1,
             "stop_after_epochs", self.stop_after_epochs, "None or >= 1"),
            (0.0 <= self.validation_split < 1.0, "validation_split", self.validation_split,
             "in [0, 1)"),
            (self.checkpoint_every_n_epochs >= 0, "checkpoint_every_n_epochs",
             self.checkpoint_every_n_epochs, ">= 0"),
            (self.checkpoint_every_n_steps >= 0, "checkpoint_every_n_steps",
             self.checkpoint_every_n_steps, ">= 0"),
            (self.stop_after_steps is None or self.stop_after_steps >= 1, "stop_after_steps",
             self.stop_after_steps, "None or >= 1"),
            (not ((self.checkpoint_every_n_epochs or self.checkpoint_every_n_steps
                   or self.resume) and not self.checkpoint_dir),
             "checkpoint_dir", self.checkpoint_dir, "set when checkpointing or resuming"),
            (self.checkpoint_keep_last is None or (isinstance(self.checkpoint_keep_last, int)
                                                   and self.checkpoint_keep_last >= 1),
             "checkpoint_keep_last", self.checkpoint_keep_last, "None (keep all) or >= 1"),
        ]
        for ok, name, value, want in checks:
            if not ok:
                raise ValueError(f"{rank_prefix()} TrainerConfig: {name}={value!r}; it must be "
                                 f"{want}.")
