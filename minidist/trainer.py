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

Parts (in the training wing's package): ``TrainerConfig`` in minidist/checkpoint/trainer_config.py,
``History`` in checkpoint/history.py, the checks and the reporting in trainer_checks.py and
trainer_report.py (base classes of ``Trainer``).
"""

from __future__ import annotations

import dataclasses
import contextlib
import math
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from minidist import amp, comm
from minidist import tracing as trace
from minidist import xp as backend
from minidist.checkpoint import checkpoint_path, save_checkpoint
from minidist.checkpoint.history import History
from minidist.checkpoint.trainer_checks import TrainerChecks
from minidist.checkpoint.trainer_report import TrainerReport, compile_note, draw_progress
from minidist.checkpoint.trainer_config import (AGREED_CONFIG, LR_SCALINGS,  # noqa: F401
                                                SCHEDULES, TrainerConfig, TrainingDiverged)
from minidist.checkpoint.resume import (agree_on_checkpoint, check_writable,
                                        no_checkpoint_error, refuse_used_folder, restore)
from minidist.data import DataLoader, DistributedSampler, random_split
from minidist.ddp import DistributedDataParallel
from minidist.kernels import jit_cache
from minidist.logger import get_logger, rank_prefix
from minidist.optim import LinearWarmup, WarmupCosine
from minidist.tensor import Tensor, no_grad
from minidist.tensor import random as tensor_random

log = get_logger(__name__)


class Trainer(TrainerChecks, TrainerReport):
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
                      + compile_note(kernels_before, jit_cache.stats()))
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
                draw_progress(b + 1, len(loader), epoch, float(loss.item()))
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
