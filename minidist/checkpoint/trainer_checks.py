"""The checks a Trainer runs around its training loop: mixed precision settings, float16
pitfalls, and the pre-flight agreement of every rank before step 0.

``TrainerChecks`` is a base class of ``minidist.trainer.Trainer`` (its methods read the
Trainer's ``config``, ``optimizer``, ``model``, ``scaler``, ``ddp``, ``rank`` and
``world_size``); it holds no state of its own.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from minidist import amp
from minidist.checkpoint.trainer_config import AGREED_CONFIG
from minidist.logger import rank_prefix
from minidist.watch.preflight import check_manifest


class TrainerChecks:
    """The Trainer's checks of amp, float16 and the ranks' agreement (see the module)."""

    config: Any
    optimizer: Any
    model: Any
    scaler: Any
    ddp: Any
    rank: int
    world_size: int
    preflight_fields: dict
    _fp16_path_checked: bool

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
                    "trainer config": {k: getattr(cfg, k) for k in AGREED_CONFIG},
                    **self.preflight_fields}
        check_manifest(manifest, "Trainer.fit", self.ddp.process_group)
