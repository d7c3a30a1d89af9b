"""A GradScaler's settings as torch exposes them: the accessors, ``state_dict`` and repr.

``get_scale`` / ``get_growth_factor`` / ``set_growth_interval`` ..., ``is_enabled``,
``skipped_steps``, and ``state_dict`` / ``load_state_dict`` with torch's keys (a state saved by
torch's GradScaler loads here). ``ScalerSettings`` is a base class of
``minidist.amp.grad_scaler.GradScaler``: it reads and writes the scaler's fields.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minidist import xp as backend
from minidist.logger import rank_prefix
from minidist.tensor import Tensor


class ScalerSettings:
    """The settings half of GradScaler (see the module)."""

    _enabled: bool
    _device: str
    _scale: Any
    _growth_tracker: Any
    _init_scale: float
    _init_growth_tracker: int
    _growth_factor: float
    _backoff_factor: float
    _growth_interval: int
    _inv_fresh: bool
    _report: Any

    def _set_scale(self, new_scale: Any) -> None:
        if isinstance(new_scale, (int, float)):
            self._scale[...] = float(new_scale)
            return
        arr = new_scale.array if isinstance(new_scale, Tensor) else new_scale
        if getattr(arr, "size", 0) != 1 or getattr(arr, "dtype", None) != np.float32:
            raise ValueError(f"{rank_prefix()} GradScaler.update: new_scale should be a float or "
                             "a 1-element float32 array/Tensor, got "
                             f"{type(new_scale).__name__} {getattr(arr, 'dtype', '')}.")
        self._scale[...] = backend.get_array_module(self._scale).asarray(arr).reshape(1)

    # ------------------------------------------------------------------ accessors

    def get_scale(self) -> float:
        """The current scale as a Python float (1.0 when disabled); a host read on a GPU."""
        if not self._enabled:
            return 1.0
        if self._scale is None:
            return self._init_scale
        return float(backend.to_host(self._scale, explicit="get_scale")[0])

    def get_growth_factor(self) -> float:
        return self._growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        self._growth_factor = float(new_factor)

    def get_backoff_factor(self) -> float:
        return self._backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        self._backoff_factor = float(new_factor)

    def get_growth_interval(self) -> int:
        return self._growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        self._growth_interval = int(new_interval)

    def _get_growth_tracker(self) -> int:
        if self._growth_tracker is None:
            return self._init_growth_tracker
        return int(self._growth_tracker[0])

    def is_enabled(self) -> bool:
        return self._enabled

    @property
    def skipped_steps(self) -> int:
        """Optimizer steps skipped because of inf/NaN gradients so far (not in state_dict)."""
        return self._report.num_skipped

    def state_dict(self) -> dict[str, Any]:
        """torch's keys: scale, growth_factor, backoff_factor, growth_interval, _growth_tracker.

        Empty when disabled (as torch).
        """
        if not self._enabled:
            return {}
        return {"scale": self.get_scale(), "growth_factor": self._growth_factor,
                "backoff_factor": self._backoff_factor, "growth_interval": self._growth_interval,
                "_growth_tracker": self._get_growth_tracker()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore ``state_dict()`` (also one saved by torch's GradScaler: same keys).

        Raises:
            RuntimeError: the state dict is empty (saved from a disabled scaler).
        """
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError(f"{rank_prefix()} GradScaler.load_state_dict: The source state "
                               "dict is empty, possibly because it was saved from a disabled "
                               "instance of GradScaler. Start this scaler fresh instead.")
        self._init_scale = float(state_dict["scale"])
        self._growth_factor = float(state_dict["growth_factor"])
        self._backoff_factor = float(state_dict["backoff_factor"])
        self._growth_interval = int(state_dict["growth_interval"])
        self._init_growth_tracker = int(state_dict["_growth_tracker"])
        self._inv_fresh = False
        if self._scale is not None:
            self._scale[...] = self._init_scale
        if self._growth_tracker is not None:
            self._growth_tracker[...] = self._init_growth_tracker

    def __repr__(self) -> str:
        return (f"GradScaler(device={self._device!r}, scale={self.get_scale():g}, "
                f"enabled={self._enabled})")
