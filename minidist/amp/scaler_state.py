"""The per-step state of a GradScaler: where each optimizer is, what DDP unscaled, the flags.

    OptState        READY -> UNSCALED -> STEPPED, per optimizer and step (torch's OptState)
    OptimizerStep  one optimizer's stage, its flag slots, whether its step was skipped
    FoldedBucket   a bucket DDP unscaled this step (its targets, names, flag slot)
    FlagSlots      the step's inf/NaN flags: one persistent float32 device array, a slot per
                    bucket and per optimizer, zeroed by ``update_scale_``

``minidist.amp.grad_scaler.GradScaler`` keeps them (and re-exports ``OptState``).
"""

from __future__ import annotations

import enum
import threading
from typing import Any

import numpy as np

from minidist import xp as backend


class OptState(enum.Enum):
    """Where one optimizer is in the current step (torch's OptState)."""

    READY = 0
    UNSCALED = 1
    STEPPED = 2


class OptimizerStep:
    """This step's bookkeeping for one optimizer."""

    def __init__(self) -> None:
        self.stage = OptState.READY
        self.slots: list[int] | None = None  # its flags in the scaler's array, once unscaled
        self.skipped: bool | None = None  # known after step()


class FoldedBucket:
    """A bucket DDP unscaled this step: its targets (params or masters), names, flag slot."""

    def __init__(self, targets: list, names: list, slot: int, found_inf: Any) -> None:
        self.targets, self.names, self.slot, self.found_inf = targets, names, slot, found_inf


class FlagSlots:
    """The step's inf/NaN flags: ONE persistent float32 array on the device, one slot per
    DDP bucket and per optimizer (kept across steps, so every kernel writes to the same
    addresses: its launch plan is reused). ``update_scale_`` reads every slot and zeroes them
    for the next step: no allocation and no zeroing launch per step.

        flags = [bucket 0 | bucket 1 | ... | optimizer A | optimizer B | unused ...]
    """

    def __init__(self, like: Any, capacity: int = 64) -> None:
        self._xp = backend.get_array_module(like)
        self.array = self._xp.zeros(capacity, dtype=np.float32)
        self._views: list[Any] = []
        self._slot_of: dict[Any, int] = {}
        self._lock = threading.Lock()  # DDP's comm thread takes bucket slots
        self.dirty = False             # a kernel may have set a flag since the last reset

    def slot(self, key: Any) -> tuple[int, Any]:
        """The slot index of ``key`` and its float32[1] view (created on first use)."""
        with self._lock:
            j = self._slot_of.get(key)
            if j is None:
                j = self._slot_of[key] = len(self._views)
                if j == self.array.size:  # grow (rare): the values so far come along
                    bigger = self._xp.zeros(2 * self.array.size, dtype=np.float32)
                    bigger[:j] = self.array
                    self.array = bigger
                    self._views = [self.array[k:k + 1] for k in range(j)]
                self._views.append(self.array[j:j + 1])
            self.dirty = True
            return j, self._views[j]

    def read(self) -> np.ndarray:
        """Every slot on the host (one device-to-host copy)."""
        return backend.to_host(self.array[:len(self._views)], op="GradScaler.step")

    def zero(self) -> None:
        self.array[...] = 0
        self.dirty = False
