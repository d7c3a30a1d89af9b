"""GradScaler: dynamic loss scaling with torch.amp.GradScaler's API, states and errors.

    scaler = amp.GradScaler()                       # init_scale 2**16, x2 every 2000 good steps
    for x, y in loader:
        with amp.autocast("cpu", dtype=amp.float16):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()               # grads are scaled by S
        scaler.unscale_(opt)                        # optional: to clip the true gradients
        clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)                            # skipped if any grad is inf/NaN
        scaler.update()                             # S: x0.5 after a bad step, x2 after 2000 good
        opt.zero_grad()

Why: float16 flushes values below 6e-8 to zero and overflows above 65504. Small gradients
underflow, so the loss (and with it every gradient) is multiplied by S before backward and
divided by S before the optimizer sees it. S is set dynamically, as large as fits::

               found inf/NaN: skip optimizer.step(), S *= backoff_factor, tracker = 0
             .----------------------------------------------------------------.
             v                                                                |
        [ step with scale S ] --all finite: step; tracker += 1----> tracker == growth_interval?
             ^                                                         |no           |yes
             '---------------------------------------------------------'             |
             '---- S *= growth_factor (unless that is inf), tracker = 0 -------------'

Per optimizer and step, an explicit state (torch's ``OptState``) catches misuse::

    READY --unscale_()--> UNSCALED --step()--> STEPPED --update()--> READY
      '------------------step() (unscales first)-----'

The scale and growth tracker are 1-element arrays on the gradients' device, updated by the
``update_scale_`` kernel; the only host read is ``step()``'s look at the step's inf/NaN flags
(torch reads them there too). Unscaling and the inf/NaN check are ONE pass
(``kernels.unscale_and_check_``), and ``unscale_`` covers all the gradients of an optimizer with
ONE call (``kernels.foreach_unscale_and_check_``). The buffers a step's kernels touch are
persistent (scale, tracker, 1/scale, the flags: one device array with a slot per bucket and per
optimizer, zeroed by ``update_scale_``), so on a GPU each launch reuses its launch plan.

Under DistributedDataParallel the pass happens earlier, per bucket: ``scale()`` makes this scaler
the ACTIVE one (while the scaled loss lives, until ``update()``); DDP's reducer takes it when it launches a bucket and, right after the bucket's
all-reduce, calls ``unscale_bucket_`` instead of its own finiteness check, so unscaling costs no
extra pass over the gradients. The reduced buckets are identical on every rank, hence so are the
found_inf flags, the skip decision and the next scale: no extra collective. ``unscale_`` then
only handles gradients no bucket covered. Float16 buckets (``MasterWeights``) are unscaled
straight into a flat float32 buffer of master gradients.

Parts: scaler_state.py (per-step state), scaler_settings.py (accessors, state_dict).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Sequence

import numpy as np

from minidist import kernels
from minidist import xp as backend
from minidist.amp.master_weights import MasterParameter, MasterWeights, bucket_offsets, owner_of
from minidist.amp.overflow import OverflowReport, first_nonfinite
from minidist.logger import get_logger, rank_prefix
from minidist.amp.scaled_values import (fusable, map_tensors, params_of, tensors_in,
                                        unscale_unfused)
from minidist.amp.scaler_settings import ScalerSettings
from minidist.amp.scaler_state import FlagSlots, FoldedBucket, OptimizerStep, OptState
from minidist.optim.grad_scaling import notify_scale
from minidist.tensor import Tensor

log = get_logger(__name__)

_FIX_NO_SCALE = ("This may indicate your script did not use scaler.scale(loss or outputs) "
                 "earlier in the iteration.")

_active = threading.local()


def active_scaler() -> GradScaler | None:
    """The scaler whose ``scale()`` ran last on this thread, while the tensor it returned is
    alive (its backward is running or to come) and ``update()`` has not been called.

    Tying it to the scaled tensor's lifetime means that a step abandoned halfway (an exception
    between ``scale`` and ``update``) cannot make a later, unrelated backward unscale its
    gradients. (DDP does not ask: it is told, see ``optim.grad_scaling.add_scale_listener``.)
    """
    scaler = getattr(_active, "scaler", None)
    if scaler is None or _active.output() is None:
        return None
    return scaler


class GradScaler(ScalerSettings):
    """Dynamic loss scaling (torch.amp.GradScaler's arguments, methods and state dict).

    Args:
        device: "cpu" or "cuda": where the training runs (the scale lives on the device of the
            first output passed to ``scale``). "cuda" without a usable GPU disables the
            scaler with a warning, as torch does.
        init_scale: the first scale.
        growth_factor: multiply the scale by this after ``growth_interval`` good steps (> 1).
        backoff_factor: multiply the scale by this after a step with inf/NaN (in (0, 1)).
        growth_interval: good steps in a row before the scale grows.
        enabled: False makes every method a pass-through (``scale`` returns its input,
            ``step`` calls ``optimizer.step()``), so one loop serves both modes.

    Raises:
        ValueError: a factor or the interval is out of range, or an unknown device.
    """

    def __init__(self, device: str = "cpu", init_scale: float = 2.0 ** 16,
                 growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, enabled: bool = True) -> None:
        name = f"{rank_prefix()} GradScaler"
        if device not in ("cpu", "cuda"):
            raise ValueError(f"{name}: device={device!r}; use 'cpu' or 'cuda'.")
        if not init_scale > 0:
            raise ValueError(f"{name}: init_scale={init_scale}; it must be > 0.")
        if not growth_factor > 1.0:
            raise ValueError(f"{name}: growth_factor={growth_factor}; it must be > 1.0.")
        if not 0.0 < backoff_factor < 1.0:
            raise ValueError(f"{name}: backoff_factor={backoff_factor}; it must be in (0, 1).")
        if not (isinstance(growth_interval, int) and growth_interval > 0):
            raise ValueError(f"{name}: growth_interval={growth_interval!r}; it must be a "
                             "positive int.")
        self._device = device
        self._enabled = bool(enabled)
        if self._enabled and device == "cuda" and not backend.gpu_available():
            log.warning("GradScaler is enabled, but CUDA is not available. Disabling.")
            self._enabled = False
        self._init_scale = float(init_scale)
        self._growth_factor = float(growth_factor)
        self._backoff_factor = float(backoff_factor)
        self._growth_interval = int(growth_interval)
        self._init_growth_tracker = 0
        self._scale: Any = None           # float32[1] on the device
        self._growth_tracker: Any = None  # int32[1] on the device
        self._inv_scale: Any = None       # this step's 1/scale, float32[1] (persistent)
        self._inv_fresh = False
        self._per_optimizer: dict[int, OptimizerStep] = {}
        self._flags: FlagSlots | None = None     # the step's flags, on the device
        self._folded: list[FoldedBucket] = []
        self._folded_found: dict[int, int] = {}   # id(param or master) -> its bucket's slot
        self._num_steps = 0            # update() calls: the "step" in messages
        self._report = OverflowReport()  # skipped steps, the scale-floor warning

    # ------------------------------------------------------------------ scaling the loss

    def scale(self, outputs: Any) -> Any:
        """Multiply ``outputs`` (a Tensor, or a list/tuple of them) by the current scale.

        The product is float32 (a float16 loss is widened first, so the scale cannot overflow
        it). Makes this scaler the active one for DDP (``active_scaler``) while the returned
        tensor lives, until ``update()``.
        """
        if not self._enabled:
            return outputs
        if self._folded:
            raise RuntimeError(
                f"{rank_prefix()} GradScaler.scale: DistributedDataParallel already unscaled "
                "this step's gradients during an earlier synced backward, so a second scaled "
                "backward would mix scaled and unscaled values. Accumulate micro-batches under "
                "ddp.no_sync() (only the last backward syncs), or sum the losses into one "
                "backward, or call scaler.step(optimizer) and scaler.update() in between.")
        first = next(iter(tensors_in(outputs)), None)
        if first is None:
            raise TypeError(f"{rank_prefix()} GradScaler.scale: expected a Tensor or a "
                            f"list/tuple of Tensors, got {type(outputs).__name__}.")
        if self._scale is None:
            self._lazy_init(first.array)
        flags = self._flags
        if flags is not None and flags.dirty and not self._per_optimizer:
            flags.zero()  # a step abandoned after unscaling: its flags must not skip this one
        factor = Tensor(self._scale.reshape(()).copy())
        scaled = map_tensors(outputs, lambda t: (t.float() if t.dtype == np.float16 else t) * factor)
        _active.scaler, _active.output = self, weakref.ref(next(iter(tensors_in(scaled))))
        notify_scale(self)  # DDP listens (minidist/optim/grad_scaling.py)
        return scaled

    def _lazy_init(self, like: Any) -> None:
        xp = backend.get_array_module(like)
        self._scale = xp.full(1, self._init_scale, dtype=np.float32)
        self._growth_tracker = xp.full(1, self._init_growth_tracker, dtype=np.int32)
        self._flags = FlagSlots(self._scale)

    def _check_scale(self, funcname: str) -> None:
        if self._scale is None:
            raise RuntimeError(f"{rank_prefix()} GradScaler.{funcname}: attempted {funcname}() "
                               f"but the scale is not set yet. {_FIX_NO_SCALE}")

    def _inv(self) -> Any:
        """1 / scale as float32[1] (torch: scale.double().reciprocal().float()), once a step."""
        if self._inv_scale is None:
            self._inv_scale = backend.get_array_module(self._scale).empty(1, dtype=np.float32)
        if not self._inv_fresh:  # float64 reciprocal, rounded once to float32 (as torch)
            self._inv_scale[...] = 1.0 / self._scale.astype(np.float64)
            self._inv_fresh = True
        return self._inv_scale

    # ------------------------------------------------------------------ the DDP fold

    def unscale_bucket_(self, buffer: Any, params: Sequence[Any],
                        names: Sequence[str] | None = None,
                        offsets: Sequence[int] | None = None) -> bool:
        """Unscale one flat gradient buffer (a DDP bucket) with ONE kernel call.

        Called by DDP's reducer right after the bucket's all-reduce. A float32 bucket is
        unscaled in place; a float16 bucket of ``MasterWeights`` parameters is unscaled into a
        flat float32 buffer whose views are the masters' ``.grad``. Its inf/NaN flag is kept
        for ``unscale_``/``step`` of whichever optimizer owns these parameters.

        Args:
            buffer: the flat gradient buffer; ``params``' gradients are views of it.
            params: the parameters in the bucket, in buffer order.
            names: their names, for the report of a skipped step.
            offsets: where each gradient starts in ``buffer`` (elements; a DDP bucket starts
                each one on a cache line, the zeros between them unscale to zeros); None:
                one after the other from 0.

        Returns:
            False when this bucket cannot be folded (float64, or float16 without masters);
            then nothing was done and the caller checks it as usual.
        """
        if not self._enabled or self._scale is None:
            return False
        offsets = bucket_offsets(params) if offsets is None else list(offsets)
        if (not params or len(offsets) != len(params)
                or offsets[-1] + int(params[-1].array.size) > buffer.size):
            return False
        targets: list[Any] = list(params)
        if buffer.dtype == np.float32:
            dst = buffer
        elif buffer.dtype == np.float16:
            owners = {id(owner_of(p)) for p in params}
            owner = owner_of(params[0])
            if owner is None or len(owners) != 1:
                return False  # float16 without masters: unscale_ raises torch's error
            targets = [owner.master_of(p) for p in params]
            dst = owner.bucket_grad_buffer(params, offsets, buffer.size)
        else:
            return False
        assert self._flags is not None
        slot, found = self._flags.slot(("bucket", id(buffer)))
        kernels.unscale_and_check_(buffer, dst, self._inv(), found)
        self._folded.append(FoldedBucket(targets, list(names or []), slot, found))
        for t in targets:
            self._folded_found[id(t)] = slot
        return True

    # ------------------------------------------------------------------ torch's API

    def unscale_(self, optimizer: Any) -> None:
        """Divide ``optimizer``'s gradients by the scale in place (inf/NaN noted, not raised).

        Call it at most once per step, after backward, when you need the true gradients
        before ``step`` (to clip them); ``step`` calls it otherwise.

        Raises:
            RuntimeError: called twice since ``update()``, after ``step()``, or before ``scale``.
            ValueError: a gradient is float16 (use ``MasterWeights``).
        """
        if not self._enabled:
            return
        self._check_scale("unscale_")
        state = self._state_of(optimizer)
        if state.stage is OptState.UNSCALED:
            raise RuntimeError(
                f"{rank_prefix()} GradScaler.unscale_: unscale_() has already been called on "
                "this optimizer since the last update(). Call it once per step, between "
                "backward and step(); step() unscales by itself when you did not.")
        if state.stage is OptState.STEPPED:
            raise RuntimeError(
                f"{rank_prefix()} GradScaler.unscale_: unscale_() is being called after "
                "step(). Call unscale_() before step() (e.g. to clip gradients), then step(), "
                "then update().")
        state.slots = self._unscale_grads_(optimizer)
        state.stage = OptState.UNSCALED

    def _unscale_grads_(self, optimizer: Any) -> list[int]:
        """Unscale what no DDP bucket covered, in ONE kernel call for all of it (a multi-buffer
        launch on a GPU); returns the flag slots of this optimizer's gradients."""
        inv = self._inv()
        assert self._flags is not None
        own_slot, found = self._flags.slot(("optimizer", id(optimizer)))
        slots: dict[int, None] = {own_slot: None}
        srcs: list[Any] = []
        dsts: list[Any] = []
        checked = 0
        for i, p in enumerate(params_of(optimizer)):
            folded = self._folded_found.get(id(p))
            if folded is not None:
                slots[folded] = None
                checked += 1
                continue
            if isinstance(p, MasterParameter):
                src = None if p.model.grad is None else p.model.grad.array
                if src is None:
                    p.grad = None
                    continue
                dst = owner_of(p.model).grad_buffer(p)
                p.grad = dst
            else:
                src = dst = None if p.grad is None else p.grad.array
                if src is None:
                    continue
                if src.dtype == np.float16:
                    raise ValueError(
                        f"{rank_prefix()} GradScaler.unscale_: Attempting to unscale FP16 "
                        f"gradients (parameter #{i}, shape {tuple(src.shape)}). Unscaling in "
                        "float16 flushes small gradients to zero. Keep float32 parameters "
                        "(autocast already computes in float16), or wrap the optimizer in "
                        "minidist.amp.MasterWeights for float16 weights with float32 masters.")
            if fusable(src, dst):
                flat = src.reshape(-1)
                srcs.append(flat)
                dsts.append(flat if dst is src else dst.reshape(-1))  # in place: same object
            else:
                unscale_unfused(src, dst, inv, found)
            checked += 1
        if checked == 0:
            raise RuntimeError(
                f"{rank_prefix()} GradScaler: No inf checks were recorded for this optimizer: "
                "none of its parameters has a gradient. Call scaler.scale(loss).backward() "
                "before scaler.step(optimizer), with this optimizer built over the model's "
                "parameters.")
        if srcs:
            kernels.foreach_unscale_and_check_(srcs, dsts, inv, found)
        if isinstance(optimizer, MasterWeights):
            optimizer.master_grads_current = True
        return list(slots)

    def step(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        """``optimizer.step()`` unless this step's gradients hold inf/NaN (then skipped).

        Unscales first if ``unscale_`` was not called. A skipped step changes neither the
        parameters nor the optimizer's state (momentum, Adam moments, step counts).

        Returns:
            What ``optimizer.step`` returned, or None when the step was skipped.
        """
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError(f"{rank_prefix()} GradScaler.step: Closure use is not currently "
                               "supported if GradScaler is enabled.")
        self._check_scale("step")
        state = self._state_of(optimizer)
        if state.stage is OptState.STEPPED:
            raise RuntimeError(
                f"{rank_prefix()} GradScaler.step: step() has already been called since the "
                "last update(). Call scaler.update() once after the step() calls of a step.")
        if state.stage is OptState.READY:
            self.unscale_(optimizer)
        retval = None
        assert self._flags is not None and state.slots is not None
        host = self._flags.read()  # the one host read (as torch)
        state.skipped = bool(any(host[j] != 0.0 for j in state.slots))
        if state.skipped:
            buckets = [(b.found_inf, b.targets, b.names) for b in self._folded
                       if host[b.slot] != 0.0]
            first = first_nonfinite(buckets, list(params_of(optimizer)), set(self._folded_found))
            self._report.skipped(self._num_steps, first, self.get_scale(), self._backoff_factor)
        else:
            retval = optimizer.step(*args, **kwargs)
        state.stage = OptState.STEPPED
        return retval

    def update(self, new_scale: float | Any = None) -> None:
        """End the step: set the next scale by the dynamic rule (or to ``new_scale``).

        Raises:
            RuntimeError: no ``scale()`` yet, or no optimizer was unscaled/stepped this step.
        """
        if not self._enabled:
            return
        self._check_scale("update")
        assert self._flags is not None
        if new_scale is not None:
            self._set_scale(new_scale)
            self._flags.zero()
        else:
            if not any(s.slots is not None for s in self._per_optimizer.values()):
                raise RuntimeError(
                    f"{rank_prefix()} GradScaler.update: No inf checks were recorded prior to "
                    "update(). Call scaler.step(optimizer) (or scaler.unscale_(optimizer)) "
                    "before scaler.update().")
            # every slot: the step's buckets and optimizers; the kernel zeroes them all
            kernels.update_scale_(self._scale, self._growth_tracker, self._flags.array,
                                  self._growth_factor, self._backoff_factor,
                                  self._growth_interval)
            self._flags.dirty = False
        if any(s.skipped for s in self._per_optimizer.values()):
            self._report.check_floor(self.get_scale())  # a host read, on skipped steps only
        self._num_steps += 1
        self._per_optimizer.clear()
        self._folded.clear()
        self._folded_found.clear()
        self._inv_fresh = False
        if getattr(_active, "scaler", None) is self:
            _active.scaler = None

    def _state_of(self, optimizer: Any) -> OptimizerStep:
        state = self._per_optimizer.get(id(optimizer))
        if state is None:
            state = self._per_optimizer[id(optimizer)] = OptimizerStep()
        return state
