"""MasterWeights: float16 model weights, float32 master copies that the optimizer updates.

    model = build_model()                                  # float32 parameters
    opt = amp.MasterWeights(optim.AdamW(model.parameters(), lr=1e-3))
    ddp = DistributedDataParallel(model)                   # AFTER: its buckets are float16
    scaler = amp.GradScaler()
    with amp.autocast("cpu", dtype=amp.float16):
        loss = loss_fn(ddp(x), y)
    scaler.scale(loss).backward()      # float16 grads, all-reduced as float16 (half the bytes)
    scaler.step(opt)                   # unscale float16 -> float32 master grads, step, copy back
    scaler.update()
    opt.zero_grad()

Why masters: a float16 weight cannot absorb an update smaller than half its spacing (2^-11 of
its value), so lr * grad updates of ~1e-4 relative simply vanish. The optimizer therefore steps
float32 copies and only the forward/backward see float16 weights::

    model params (float16, one flat buffer)  --forward/backward-->  float16 grads (DDP buckets)
          ^                                                               |
          | master_to_model: one kernel call                              | unscale_and_check:
          | (round to nearest even)                                       | one kernel call per
          |                                                               v bucket
    master params (float32, one flat buffer)  <--optimizer.step--  float32 master grads

Construction converts the model IN PLACE: each parameter of ``optimizer`` gets a float32 master
(an exact copy of its value) that replaces it in the optimizer's groups, and its ``.array``
becomes a float16 view of one flat buffer (the rounded value). So the order is: build the model,
build the optimizer, wrap it in MasterWeights, THEN wrap the model in DistributedDataParallel
(whose buckets then hold float16 gradients; it broadcasts the masters too).

Gradients: ``GradScaler.unscale_`` (or DDP's per-bucket fold, see ``grad_scaler.py``) writes
the unscaled float32 gradient of each model parameter into its master's ``.grad``. Without a
scaler, ``step()`` copies the model's float16 gradients into the masters itself.

``state_dict()`` is the inner optimizer's plus ``"master_weights"`` (the float32 masters), so
a checkpoint resumes bit for bit although the model's own state_dict holds float16 values.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import numpy as np

from minidist import kernels
from minidist import xp as backend
from minidist.logger import get_logger, rank_prefix
from minidist.nn import Parameter
from minidist.optim import Optimizer
from minidist.optim.grad_scaling import master_owner, set_master_owner

log = get_logger(__name__)



def bucket_offsets(params: Sequence[Any]) -> list[int]:
    """Where each of ``params``' gradients starts in a flat buffer that holds them one after
    the other (elements)."""
    offsets, off = [], 0
    for p in params:
        offsets.append(off)
        off += int(p.array.size)
    return offsets

class MasterParameter(Parameter):
    """The float32 master copy of a float16 model parameter (what the optimizer updates).

    Attributes:
        model: the float16 model parameter whose gradient this master receives.
    """

    __slots__ = ("model",)


def owner_of(param: Any) -> MasterWeights | None:
    """The MasterWeights holding ``param``'s float32 master, or None for a plain parameter."""
    return master_owner(param)


class MasterWeights(Optimizer):
    """Wrap ``optimizer`` so it steps float32 masters of float16 model weights (see module doc).

    Behaves as an Optimizer (``param_groups``, ``state``, ``zero_grad``, ``step``,
    ``state_dict``): LR schedules and ``GradScaler`` take it where they take the optimizer.

    Args:
        optimizer: built over the model's float32 parameters, before any backward.

    Raises:
        ValueError: a parameter is not float32, already has a gradient, or belongs to another
            MasterWeights (each message says what to do).
    """

    def __init__(self, optimizer: Optimizer) -> None:
        # Optimizer.__init__ is not called: the groups and state are the inner optimizer's.
        self.optimizer = optimizer
        self._masters: list[MasterParameter] = []
        self._master_of: dict[int, MasterParameter] = {}
        self._bucket_grads: dict[tuple[int, ...], tuple[Any, list]] = {}
        self._grad_slices: dict[int, tuple[int, int, tuple[int, ...]]] = {}
        self.master_grad_buffer: Any = None  # float32 master grads outside DDP, flat (lazy)
        self.master_grads_current = False  # master .grad hold this step's unscaled gradients
        params = [p for g in optimizer.param_groups for p in g["params"]]
        for i, p in enumerate(params):
            self._check_convertible(i, p)
        xp = backend.get_array_module(params[0].array)
        total = sum(int(p.array.size) for p in params)
        self.master_buffer = xp.empty(total, dtype=np.float32)   # every master, flat
        self.model_buffer = xp.empty(total, dtype=np.float16)    # every model weight, flat
        off = 0
        for group in optimizer.param_groups:
            for k, p in enumerate(group["params"]):
                n, shape = int(p.array.size), p.array.shape
                master_view = self.master_buffer[off:off + n].reshape(shape)
                master_view[...] = p.array  # float32 -> float32: exact
                master = MasterParameter(master_view)
                master.model = p
                p.array = self.model_buffer[off:off + n].reshape(shape)  # rebound: before DDP
                group["params"][k] = master
                self._masters.append(master)
                self._grad_slices[id(master)] = (off, n, tuple(shape))
                self._master_of[id(p)] = master
                set_master_owner(p, self)
                off += n
        kernels.master_to_model(self.master_buffer, self.model_buffer)
        log.debug("MasterWeights: %d parameters (%d elements) now float16 with float32 masters",
                  len(params), total)

    def _check_convertible(self, i: int, p: Any) -> None:
        where = f"{rank_prefix()} MasterWeights: parameter #{i} (shape {tuple(p.array.shape)})"
        if owner_of(p) is not None or isinstance(p, MasterParameter):
            raise ValueError(f"{where} is already converted by another MasterWeights. Wrap each "
                             "optimizer once.")
        if p.array.dtype != np.float32:
            raise ValueError(f"{where} is {p.array.dtype}; MasterWeights converts float32 "
                             "parameters to float16. Build the model in float32.")
        if p.grad is not None:
            raise ValueError(f"{where} already has a gradient. Build MasterWeights right after "
                             "the optimizer, BEFORE wrapping the model in "
                             "DistributedDataParallel (which attaches gradient buckets) and "
                             "before any backward.")

    # ------------------------------------------------------------------ the Optimizer face

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        """The inner optimizer's groups; their ``"params"`` are the float32 masters."""
        return self.optimizer.param_groups

    @property
    def state(self) -> dict[int, dict[str, Any]]:  # type: ignore[override]
        return self.optimizer.state

    @property
    def defaults(self) -> dict[str, Any]:  # type: ignore[override]
        return self.optimizer.defaults

    def masters(self) -> list[MasterParameter]:
        """The float32 masters, in the optimizer's parameter order."""
        return list(self._masters)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        raise ValueError(f"{rank_prefix()} MasterWeights.add_param_group: groups cannot be "
                         "added after conversion. Add them to the optimizer before wrapping it.")

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the model's float16 gradients (as ``Optimizer.zero_grad``) and the masters'."""
        for m in self._masters:
            g = None if m.model.grad is None else m.model.grad.array
            if g is not None:
                if set_to_none:
                    m.model.grad = None
                else:
                    g[...] = 0
            m.grad = None
        self.master_grads_current = False

    def step(self) -> None:
        """Step the masters, then copy them into the float16 model weights (one kernel call).

        Masters whose gradient was not written by a GradScaler this step take the model's
        float16 gradient as it is (no scaler in use).
        """
        if not self.master_grads_current:
            for m in self._masters:
                g = None if m.model.grad is None else m.model.grad.array
                if g is None:
                    m.grad = None
                else:
                    buf = self.grad_buffer(m)
                    buf[...] = g
                    m.grad = buf
        self.optimizer.step()
        kernels.master_to_model(self.master_buffer, self.model_buffer)
        self.master_grads_current = False

    # ------------------------------------------------------------------ gradient buffers

    def master_of(self, param: Any) -> MasterParameter:
        """The master of model parameter ``param``."""
        return self._master_of[id(param)]

    def grad_buffer(self, master: MasterParameter) -> Any:
        """A float32 array, kept across steps, for ``master.grad`` outside DDP buckets: a view
        of ONE flat buffer laid out like ``master_buffer`` (so consecutive masters' gradients
        are consecutive pieces of one allocation, which one kernel call can cover)."""
        if self.master_grad_buffer is None:
            xp = backend.get_array_module(self.master_buffer)
            self.master_grad_buffer = xp.empty(self.master_buffer.size, dtype=np.float32)
        off, n, shape = self._grad_slices[id(master)]
        return self.master_grad_buffer[off:off + n].reshape(shape)

    def bucket_grad_buffer(self, params: Iterable[Any], offsets: Sequence[int] | None = None,
                           numel: int | None = None) -> Any:
        """One flat float32 buffer laid out like a flat float16 bucket of ``params``.

        Every master of ``params`` gets ``.grad`` = its view of that buffer, so ONE kernel call
        can unscale the whole float16 bucket into the masters' gradients. ``offsets`` (where
        each gradient starts) and ``numel`` (the bucket's size) give the bucket's layout; by
        default the gradients lie one after the other. The buffer is kept (per bucket) across
        steps.
        """
        params = list(params)
        offsets = bucket_offsets(params) if offsets is None else list(offsets)
        key = (tuple(id(p) for p in params), tuple(offsets))
        entry = self._bucket_grads.get(key)
        if entry is None:
            xp = backend.get_array_module(params[0].array)
            end = offsets[-1] + int(params[-1].array.size) if params else 0
            flat = xp.zeros(max(end, numel or 0), dtype=np.float32)
            views = [flat[off:off + p.array.size].reshape(p.array.shape)
                     for p, off in zip(params, offsets)]
            entry = self._bucket_grads[key] = (flat, views)
        flat, views = entry
        for p, v in zip(params, views):
            self._master_of[id(p)].grad = v
        return flat

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        """The inner optimizer's state dict plus ``"master_weights"``: the float32 masters."""
        sd = self.optimizer.state_dict()
        sd["master_weights"] = [m.array.copy() for m in self._masters]
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the inner optimizer and the masters, then write the masters into the model.

        A state dict without ``"master_weights"`` (saved from a plain float32 optimizer) takes
        the masters from the model's current float16 weights, with a warning: the bits below
        float16 precision of the saved weights are lost.
        """
        inner = {k: v for k, v in state_dict.items() if k != "master_weights"}
        saved = state_dict.get("master_weights")
        name = f"{rank_prefix()} MasterWeights.load_state_dict"
        if saved is not None and len(saved) != len(self._masters):
            raise ValueError(f"{name}: {len(saved)} master weights in the state dict but "
                             f"{len(self._masters)} parameters here. Build the same model and "
                             "optimizer as the one that was saved.")
        if saved is not None:
            for i, (m, v) in enumerate(zip(self._masters, saved)):
                if tuple(getattr(v, "shape", ())) != m.shape:
                    raise ValueError(f"{name}: master weight {i} has shape "
                                     f"{tuple(getattr(v, 'shape', ()))} but the parameter has "
                                     f"shape {m.shape}. The state dict belongs to another model.")
        self.optimizer.load_state_dict(inner)
        if saved is None:
            log.warning("%s: no master weights in the state dict (saved from a float32 "
                        "optimizer?); the masters start from the model's float16 weights.", name)
            for m in self._masters:
                m.array[...] = m.model.array
        else:
            xp = backend.get_array_module(self.master_buffer)
            for m, v in zip(self._masters, saved):
                m.array[...] = xp.asarray(v)
        kernels.master_to_model(self.master_buffer, self.model_buffer)

    def __repr__(self) -> str:
        return f"MasterWeights(float16 model, float32 masters: {self.optimizer!r})"
