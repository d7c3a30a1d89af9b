"""Trainer: the fit/evaluate loop around DistributedDataParallel, with atomic checkpoints.

    from minidist import Trainer, TrainerConfig
    cfg = TrainerConfig(epochs=10, batch_size=64, lr_scaling="linear", warmup_epochs=1,
                        checkpoint_dir="runs/a", checkpoint_every_n_epochs=1)
    history = Trainer(model, nn.CrossEntropyLoss(), optim.SGD(model.parameters(), lr=0.05),
                      cfg).fit(train_set, val_set)          # same code at n=1 and under mpirun
    history.to_json("runs/a/history.json")

One epoch on every rank::

    sampler.set_epoch(e)             same permutation everywhere, a disjoint shard per rank
    for each batch (grad_accum_steps micro-batches per optimizer step):
        micro-batches 1..k-1 under ddp.no_sync()    grads add up locally, no communication
        micro-batch k: forward, backward            buckets all-reduced during backward
        optimizer.step(); scheduler.step(); optimizer.zero_grad()
    evaluate(val)                    sums of loss*count, correct, count all-reduced: exact means
    checkpoint (rank 0 writes, everyone waits at the barrier)

Resume (``TrainerConfig(resume=True)``) restores model, optimizer, scheduler, epoch, global
step, the RNG and the history from the newest checkpoint in ``checkpoint_dir`` that loads (rank
0 skips damaged ones and tells every rank which it took): 4 epochs straight and 2 + resume + 2
give the same parameters bit for bit. A save that finds NaN/inf in the state is refused on
every rank (the run diverged; the last good checkpoint stays). See docs/trainer.md.

Mixed precision (``TrainerConfig(amp=True)``, docs/amp.md): forward and loss run under
``amp.autocast`` (float16 matmul/conv; emulated on the CPU), and a ``GradScaler`` scales the
loss, skips steps whose gradients overflowed and adapts the scale; its state is checkpointed,
so resume stays bit for bit. Pass ``scaler=`` to choose its settings.
"""

from __future__ import annotations

import dataclasses
import contextlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from minidist import amp, comm
from minidist import tracing as trace
from minidist import xp as backend
from minidist.checkpoint import checkpoint_path, save_checkpoint
from minidist.checkpoint.resume import (agree_on_checkpoint, check_writable,
                                        no_checkpoint_error, refuse_used_folder, restore)
from minidist.data import DataLoader, DistributedSampler, random_split
from minidist.ddp import DistributedDataParallel
from minidist.watch.preflight import check_manifest
from minidist.kernels import jit_cache
from minidist.logger import get_logger, rank_prefix
from minidist.optim import LinearWarmup, WarmupCosine
from minidist.tensor import Tensor, no_grad
from minidist.tensor import random as tensor_random

log = get_logger(__name__)

LR_SCALINGS = ("none", "linear", "sqrt")
SCHEDULES = ("cosine", "constant")
# TrainerConfig fields that decide how many collectives run and which samples each rank sees:
# the pre-flight check at fit compares them across ranks.
_AGREED_CONFIG = ("epochs", "batch_size", "grad_accum_steps", "shuffle", "seed",
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


@dataclass
class History:
    """Per-epoch metrics of a run (averaged over all ranks) and its throughput."""

    train_losses: list = field(default_factory=list)
    train_accuracies: list = field(default_factory=list)
    val_losses: list = field(default_factory=list)
    val_accuracies: list = field(default_factory=list)
    epoch_times: list = field(default_factory=list)
    total_time_seconds: float = 0.0
    samples_per_second: float = 0.0
    effective_batch_size: int = 0
    world_size: int = 1

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self, path: str | Path | None = None) -> str:
        """The history as JSON; also written (atomically) to ``path`` when given."""
        text = json.dumps(self.to_dict(), indent=2)
        if path is not None:
            path = Path(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
            tmp.write_text(text)
            os.replace(tmp, path)
        return text

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> History:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


class Trainer:
    """Train a model data-parallel over every rank of the default process group.

    Args:
        model: the bare model (wrapped in DistributedDataParallel here) or a DDP wrapper.
        loss_fn: ``loss_fn(output, target) -> scalar Tensor`` (a mean over the batch).
        optimizer: built over ``model.parameters()`` (or an ``amp.MasterWeights``).
        config: a TrainerConfig (defaults if None).
        scaler: the ``amp.GradScaler`` to use (default: one with torch's settings, enabled
            when ``config.amp``; a disabled scaler changes nothing).

    Attributes:
        preflight_fields: extra run-manifest fields (JSON-able) that ``fit`` checks are the
            same on every rank before step 0, beside the model, data and config fields.
    """

    def __init__(self, model: Any, loss_fn: Callable[[Any, Any], Any], optimizer: Any,
                 config: TrainerConfig | None = None, scaler: amp.GradScaler | None = None
                 ) -> None:
        self.config = config or TrainerConfig()
        self.config.validate()
        if not comm.is_initialized():
            comm.init_process_group()
        self.rank, self.world_size = comm.get_rank(), comm.get_world_size()
        if self.config.trace_dir:
            trace.start(self.config.trace_dir, self.rank, self.world_size)
        if isinstance(model, DistributedDataParallel):
            self.ddp = model
        else:
            self.ddp = DistributedDataParallel(model, **self.config.ddp_options)
        self.model = self.ddp.module
        if not self.config.allow_nonfinite and self.ddp.reducer.nonfinite_grads == "warn":
            self.ddp.reducer.nonfinite_grads = "raise"  # a diverged run stops (TrainingDiverged)
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        self.device_type = backend.default_device()
        self.scaler = scaler if scaler is not None else amp.GradScaler(
            self.device_type, enabled=self.config.amp)
        self._fp16_path_checked = False
        self.scheduler: Any = None
        self.global_step = 0
        self.start_epoch = 0
        self._loader_state: dict | None = None  # a mid-epoch position from a resumed checkpoint
        self._stopped = False  # stop_after_steps reached
        self._first_step = 0  # the global step this fit started (or resumed) at
        self.history = History(world_size=self.world_size)
        # Extra run-manifest fields that every rank must agree on, checked before step 0 of
        # fit (preflight.py), e.g. {"amp": {"enabled": True, "init_scale": 65536.0}}.
        self.preflight_fields: dict[str, Any] = {"amp": self._amp_manifest()}
        # lr_scaling: the optimizer's rates are multiplied here, once, in place (see
        # TrainerConfig.lr_scaling); the factor stays readable as ``lr_scale``.
        self.lr_scale = {"none": 1.0, "linear": float(self.world_size),
                         "sqrt": math.sqrt(self.world_size)}[self.config.lr_scaling]
        before = [group["lr"] for group in optimizer.param_groups]
        for group in optimizer.param_groups:
            group["lr"] = group["lr"] * self.lr_scale
        if self.lr_scale != 1.0:
            after = [group["lr"] for group in optimizer.param_groups]
            self._log(f"lr scaled x{self.lr_scale:g} ({self.config.lr_scaling}, world size "
                      f"{self.world_size}): {', '.join(f'{b:g}' for b in before)} -> "
                      f"{', '.join(f'{a:g}' for a in after)}")

    # ------------------------------------------------------------------ public API

    def fit(self, train_dataset: Any, val_dataset: Any = None) -> History:
        """Train for ``config.epochs`` epochs (continuing a checkpoint if ``config.resume``).

        Args:
            train_dataset: an ArrayDataset (or any dataset of (x, y) samples).
            val_dataset: evaluated after every epoch; if None and ``validation_split > 0``,
                that fraction of ``train_dataset`` is held out (same split on every rank).

        Returns:
            The History (also written to ``checkpoint_dir/history.json`` when set).
        """
        cfg = self.config
        if val_dataset is None and cfg.validation_split > 0:
            train_dataset, val_dataset = random_split(
                train_dataset, [1.0 - cfg.validation_split, cfg.validation_split], seed=cfg.seed)
        sampler = DistributedSampler(train_dataset, num_replicas=self.world_size, rank=self.rank,
                                     shuffle=cfg.shuffle, seed=cfg.seed)
        loader = DataLoader(train_dataset, batch_size=cfg.batch_size, sampler=sampler)
        self._preflight(len(train_dataset), len(loader))
        if len(train_dataset) == 0:  # every rank alike (the pre-flight compared the lengths)
            raise ValueError(f"{rank_prefix()} Trainer.fit: the training dataset is empty (0 "
                             "samples), so there is nothing to train on. Check the data path "
                             "and split (validation_split holds out a fraction of it).")
        self._check_fp16_without_amp()
        steps_per_epoch = math.ceil(len(loader) / cfg.grad_accum_steps)
        self._build_schedule(steps_per_epoch * cfg.epochs, steps_per_epoch)
        if cfg.resume:
            self._resume()
        elif cfg.checkpoint_dir:  # a new run: its folder must not hold another run's files
            refuse_used_folder(cfg.checkpoint_dir, self.rank, self.world_size)
        if cfg.checkpoint_dir:  # found now, not at the first save after an epoch
            check_writable(cfg.checkpoint_dir, self.rank, self.world_size)
        first_epoch, self._first_step = self.start_epoch, self.global_step
        if self._loader_state is not None:  # a mid-epoch checkpoint: continue at its batch
            loader.load_state_dict(self._loader_state)
        if self.start_epoch >= cfg.epochs:  # resumed a finished run: say so, train nothing
            self._log(f"resume: the run in {cfg.checkpoint_dir} is complete ({self.start_epoch} "
                      f"epochs done, epochs={cfg.epochs}); nothing to train. To train longer, "
                      f"raise epochs above {self.start_epoch} (examples/train.py: --epochs N); "
                      "the learning-rate schedule then spans the new total.")
            return self.history
        self.history.effective_batch_size = cfg.batch_size * self.world_size * cfg.grad_accum_steps
        self._log(f"training on {self.world_size} rank(s): {len(train_dataset)} samples, "
                  f"{steps_per_epoch} steps/epoch, effective batch "
                  f"{self.history.effective_batch_size}, epochs {self.start_epoch + 1}.."
                  f"{cfg.epochs}")
        last = cfg.epochs if cfg.stop_after_epochs is None else min(
            cfg.epochs, first_epoch + cfg.stop_after_epochs)  # counted from this run's start
        for epoch in range(self.start_epoch, last):
            t0, kernels_before = time.perf_counter(), jit_cache.stats()
            loader.set_epoch(epoch)
            loss, acc, seen = self._train_epoch(loader, epoch)
            if self._stopped:  # stop_after_steps, mid-epoch: the checkpoint is written
                break
            elapsed = time.perf_counter() - t0
            h = self.history
            h.train_losses.append(loss)
            h.train_accuracies.append(acc)
            h.epoch_times.append(elapsed)
            h.total_time_seconds = float(sum(h.epoch_times))
            done_before = h.samples_per_second * (h.total_time_seconds - elapsed)
            h.samples_per_second = (done_before + seen) / max(h.total_time_seconds, 1e-12)
            line = (f"epoch {epoch + 1}/{cfg.epochs}  loss {loss:.4f}  acc {acc:.4f}")
            if val_dataset is not None:
                vloss, vacc = self.evaluate(val_dataset)
                h.val_losses.append(vloss)
                h.val_accuracies.append(vacc)
                line += f"  val_loss {vloss:.4f}  val_acc {vacc:.4f}"
            if self.scaler.is_enabled():
                line += (f"  scale {self.scaler.get_scale():g} (skipped "
                         f"{self.scaler.skipped_steps})")
            self._log(line + f"  {seen / elapsed:,.0f} samples/s  {elapsed:.2f}s"
                      + _compile_note(kernels_before, jit_cache.stats()))
            every = cfg.checkpoint_every_n_epochs
            if every and ((epoch + 1) % every == 0 or epoch + 1 == last):
                self.save_checkpoint(epoch + 1)
        if cfg.checkpoint_dir and self.rank == 0:
            self.history.to_json(Path(cfg.checkpoint_dir) / "history.json")
        self._merge_trace()
        return self.history

    @no_grad()
    def evaluate(self, dataset: Any) -> tuple[float, float]:
        """Loss and accuracy on ``dataset``, each sample counted exactly once over all ranks.

        Every rank evaluates its shard; padding added by the sampler is masked out; the sums
        (loss x count, correct, count) are all-reduced, so the result is the exact mean.
        """
        was_training = getattr(self.model, "training", True)
        self.model.eval()
        sampler = DistributedSampler(dataset, num_replicas=self.world_size, rank=self.rank,
                                     shuffle=False)
        loader = DataLoader(dataset, batch_size=max(self.config.batch_size, 256), sampler=sampler)
        sums = np.zeros(3, dtype=np.float64)  # loss*count, correct, count
        for x, y, mask in loader.iter_with_mask():
            if not mask.all():
                x, y = x[mask], y[mask]
            if len(y) == 0:
                continue
            with self._autocast():
                out = self.model(Tensor(x))
                loss = self.loss_fn(out, y)
            sums += self._batch_metrics(out, y, loss)
        comm.all_reduce(sums, op="sum")
        self.model.train(was_training)
        count = max(sums[2], 1.0)
        return float(sums[0] / count), float(sums[1] / count)

    def save_checkpoint(self, epoch: int, loader: DataLoader | None = None) -> Path:
        """Write everything needed to resume after ``epoch`` epochs (rank 0 writes, all wait).

        With ``loader`` mid-epoch (``checkpoint_every_n_steps``), ``epoch`` is the epoch in
        progress and the loader's position is saved too, so resume continues at its next batch.

        Raises:
            CheckpointError: on every rank alike, if the model or optimizer state holds NaN
                or inf (the run diverged): nothing is written, the last good checkpoint stays.
        """
        state = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "scaler": self.scaler.state_dict(),
            "epoch": int(epoch),
            "global_step": int(self.global_step),
            "sampler": {"epoch": int(epoch), "seed": self.config.seed,
                        "shuffle": self.config.shuffle},
            "loader": loader.state_dict() if loader is not None else None,
            "world_size": int(self.world_size),
            "rng": tensor_random.default_generator().bit_generator.state,
            "history": self.history.to_dict(),
            "config": {k: v for k, v in dataclasses.asdict(self.config).items()
                       if isinstance(v, (int, float, str, bool, type(None)))},
        }
        number = self.global_step if self.config.checkpoint_every_n_steps else epoch
        path = save_checkpoint(checkpoint_path(self.config.checkpoint_dir, number), state,
                               keep_last=self.config.checkpoint_keep_last)
        self._log(f"checkpoint: {path}")
        return path

    # ------------------------------------------------------------------ internals

    def _build_schedule(self, total_steps: int, steps_per_epoch: int) -> None:
        cfg = self.config
        warmup = int(cfg.warmup_steps + round(cfg.warmup_epochs * steps_per_epoch))
        if cfg.schedule == "constant" and warmup == 0:
            return
        if total_steps < 1:
            return
        warmup = min(warmup, total_steps - 1)
        if cfg.schedule == "cosine":
            self.scheduler = WarmupCosine(self.optimizer, warmup, total_steps, cfg.min_lr)
        else:
            self.scheduler = LinearWarmup(self.optimizer, warmup)

    def _train_epoch(self, loader: DataLoader, epoch: int) -> tuple[float, float, int]:
        cfg = self.config
        self.model.train()
        sums = np.zeros(3, dtype=np.float64)  # loss*count, correct, count (real samples only)
        batches = list(range(loader.resume_at, len(loader)))  # a resumed epoch: the rest
        show_bar = self._progress_enabled()
        accum = cfg.grad_accum_steps
        it = loader.iter_with_mask()
        tr = trace.tracer()  # the step timeline; None when tracing is off
        t_step = 0.0
        for b in batches:
            if tr is not None and b % accum == 0:
                t_step = tr.now()
            x, y, mask = next(it)
            last_micro = (b + 1) % accum == 0 or b + 1 == len(loader)
            with self._amp_errstate(), (contextlib.nullcontext() if last_micro
                                        else self.ddp.no_sync()):
                with self._autocast() as ac:
                    out = self.ddp(Tensor(x))
                    loss = self.loss_fn(out, y)
                self._check_fp16_path(ac)
                try:
                    self.scaler.scale(loss / accum if accum > 1 else loss).backward()
                except FloatingPointError as e:  # the reducer found NaN/inf (allow_nonfinite)
                    raise TrainingDiverged(f"{e} The run diverged, so it stops here "
                                           "(TrainerConfig(allow_nonfinite=True) trains on)."
                                           ) from None
            sums += self._batch_metrics(out, y, loss, mask)
            t_opt = tr.now() if tr is not None else 0.0
            if last_micro:
                self.scaler.step(self.optimizer)   # optimizer.step(), unless inf/NaN (amp)
                self.scaler.update()
                if self.scheduler is not None:
                    self.scheduler.step()
                self.optimizer.zero_grad()
                self.global_step += 1
                if cfg.log_every_n_batches and self.global_step % cfg.log_every_n_batches == 0:
                    self._log(f"epoch {epoch + 1} step {self.global_step} loss "
                              f"{float(loss.item()):.4f} (rank 0's batch)")
                every = cfg.checkpoint_every_n_steps
                stop = cfg.stop_after_steps is not None and \
                    self.global_step - self._first_step >= cfg.stop_after_steps
                if (every and self.global_step % every == 0) or (stop and cfg.checkpoint_dir):
                    self.save_checkpoint(epoch, loader)
                if stop:
                    self._stopped = True
                    break
            if tr is not None and last_micro:
                t_end, args = tr.now(), {"step": self.global_step - 1, "epoch": epoch}
                tr.complete("optimizer.step", t_opt, t_end, args=args)
                tr.complete(f"step {self.global_step - 1}", t_step, t_end, args=args)
            if show_bar:
                _progress(b + 1, len(loader), epoch, float(loss.item()))
        if show_bar:
            sys.stderr.write("\n")
        comm.all_reduce(sums, op="sum")
        count = max(sums[2], 1.0)
        return float(sums[0] / count), float(sums[1] / count), int(round(sums[2]))

    def _batch_metrics(self, out: Any, y: Any, loss: Any, mask: Any = None) -> np.ndarray:
        """[loss x count, correct, count] of a batch, real (non-padding) samples only."""
        logits = backend.to_host(out.array)
        yh = backend.to_host(y)
        correct = logits.argmax(axis=-1) == yh
        if mask is not None and not mask.all():  # padding in this batch: recompute on the rest
            with no_grad(), self._autocast():
                sub = self.loss_fn(Tensor(out.array[mask]), y[mask]) if mask.any() else None
            n = int(mask.sum())
            lsum = float(sub.item()) * n if sub is not None else 0.0
            return np.array([lsum, float(correct[mask].sum()), n], dtype=np.float64)
        n = len(yh)
        return np.array([float(loss.item()) * n, float(correct.sum()), n], dtype=np.float64)

    def _resume(self) -> None:
        chosen = agree_on_checkpoint(self.config.checkpoint_dir, self.rank, self.world_size)
        if chosen is None:
            if self.config.resume != "if_present":
                raise no_checkpoint_error(self.config.checkpoint_dir)
            self._log(f"resume: no checkpoint in {self.config.checkpoint_dir}; starting fresh")
            return
        path, ckpt = chosen
        restore(ckpt, path, self.world_size, self.model, self.optimizer, self.scheduler,
                self.scaler, self._log)
        self.start_epoch = int(ckpt["epoch"])
        self.global_step = int(ckpt["global_step"])
        loader_state = ckpt.get("loader")
        if loader_state and int(loader_state["batches_yielded"]) > 0:
            self._loader_state = loader_state
        if ckpt.get("history"):
            self.history = History.from_dict(ckpt["history"])
        self._log(f"resumed from {path}: epoch {self.start_epoch}, step {self.global_step}")

    def _autocast(self) -> amp.autocast:
        # float16 with loss scaling on both devices (torch's CPU default would be bfloat16)
        return amp.autocast(self.device_type, dtype=amp.float16, enabled=self.config.amp)

    def _amp_errstate(self) -> Any:
        """Under amp, NumPy's overflow/invalid warnings in float16 are expected: the scaler
        skips those steps. Without amp the NaN/inf check of the reduced gradients says it once
        (allow_nonfinite=False), naming the step and the tensors. A GPU raises no warnings."""
        if not self.config.amp and self.config.allow_nonfinite:
            return contextlib.nullcontext()
        return np.errstate(over="ignore", invalid="ignore")

    def _check_fp16_without_amp(self) -> None:
        """float16 parameters without amp: an optimizer eps that is 0 in float16 (Adam's 1e-8)
        divides by zero at the first step (NaN weights). Refused before step 0, naming it."""
        if self.config.amp:
            return
        for group in self.optimizer.param_groups:
            eps = group.get("eps")
            half = [p for p in group["params"] if getattr(p, "dtype", None) == np.float16]
            if half and isinstance(eps, float) and np.float16(eps) == 0:
                tiny = float(np.finfo(np.float16).smallest_subnormal)
                raise ValueError(
                    f"{rank_prefix()} Trainer: {len(half)} parameter(s) are float16 and amp is "
                    f"off, and {type(self.optimizer).__name__}'s eps={eps:g} rounds to 0 in "
                    f"float16 (the smallest float16 is {tiny:.1e}), so the first step "
                    "divides by zero and the weights turn NaN. Keep the parameters float32 and "
                    "train with TrainerConfig(amp=True) (float16 compute, float32 weights), or "
                    "give the optimizer eps >= 1e-4.")

    def _check_fp16_path(self, ac: amp.autocast) -> None:
        """amp=True on a model whose forward casts nothing to float16 is an error (once)."""
        if self._fp16_path_checked or not self.config.amp:
            return
        self._fp16_path_checked = True
        if ac.lower_precision_ops == 0:
            raise ValueError(
                f"{rank_prefix()} Trainer: amp=True, but the forward pass of "
                f"{type(self.model).__name__} ran no op in float16: autocast computes only "
                "matmul, linear and conv2d in float16, and only from float32 inputs (float64 "
                "models are left alone). Train without amp, or build the model in float32 from "
                "such layers (nn.Linear, nn.Conv2d).")

    def _progress_enabled(self) -> bool:
        if self.rank != 0:
            return False
        if self.config.progress_bar is not None:
            return self.config.progress_bar
        return sys.stderr.isatty() and not os.environ.get("CI")

    def _amp_manifest(self) -> dict[str, Any]:
        """The mixed-precision settings every rank must share (a per-rank scale diverges)."""
        sc = self.scaler
        return {"autocast": bool(self.config.amp), "scaler": sc.is_enabled(),
                "init_scale": float(sc.get_scale()) if sc.is_enabled() else None,
                "growth_factor": sc.get_growth_factor(), "backoff_factor": sc.get_backoff_factor(),
                "growth_interval": sc.get_growth_interval(),
                "master_weights": isinstance(self.optimizer, amp.MasterWeights)}

    def _preflight(self, n_samples: int, n_batches: int) -> None:
        """Before step 0: every rank must run the same model, data length and settings.

        One all_gather_object of the run manifest (DDP's fields plus the ones below): a rank
        that loaded a different dataset would otherwise run into the next collective while
        its peers still train (MPI then aborts with "Message truncated", or the wait runs into
        MINIDIST_TIMEOUT_S). Any difference raises PreflightError on every rank.
        """
        if self.world_size == 1:
            return
        cfg = self.config
        manifest = {**self.ddp.manifest,
                    "dataset length": int(n_samples), "batches per epoch": int(n_batches),
                    "trainer config": {k: getattr(cfg, k) for k in _AGREED_CONFIG},
                    **self.preflight_fields}
        check_manifest(manifest, "Trainer.fit", self.ddp.process_group)

    def _merge_trace(self) -> None:
        """Tracing on: write this rank's timeline; rank 0 merges all ranks into trace.json."""
        tr = trace.tracer()
        if tr is None:
            return
        tr.flush()
        if self.world_size > 1:
            comm.barrier()  # every rank's file is complete before rank 0 reads them
        if self.rank == 0:
            self._log(f"trace: {trace.merge(tr.directory)} (open in https://ui.perfetto.dev)")

    def _log(self, message: str) -> None:
        """Rank 0 only: print (progress for people) when verbose, else log at INFO."""
        if self.rank != 0:
            return
        if self.config.verbose:
            print(message, flush=True)
        else:
            log.info(message)


def _progress(done: int, total: int, epoch: int, loss: float, width: int = 30) -> None:
    filled = int(width * done / max(total, 1))
    sys.stderr.write(f"\repoch {epoch + 1} [{'#' * filled}{'.' * (width - filled)}] "
                     f"{done}/{total} loss {loss:.4f}")
    sys.stderr.flush()


def _compile_note(before: jit_cache.Stats, after: jit_cache.Stats) -> str:
    """What an epoch line adds when its time includes compiling the fused kernels (this
    process compiled, or waited for another process of the machine compiling them): the
    first epoch of the first run on a machine; later runs load them from the disk cache."""
    if after.compiles == before.compiles and after.waited == before.waited:
        return ""
    return (f"  (incl. {after.seconds - before.seconds:.2f}s compiling fused kernels for "
            "this machine, once)")
