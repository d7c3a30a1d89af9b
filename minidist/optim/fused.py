"""Fused optimizer steps: one compiled pass per flat buffer instead of ~10 array ops per tensor.

    opt = optim.AdamW(model.parameters(), lr=1e-3, fused=True)    # torch's argument
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=True)

With ``fused=True`` the step of every float32/float64 parameter runs in the Numba kernels of
``minidist.kernels.optim_cpu`` (NumPy arrays, ``@njit``) or ``optim_cuda`` (CuPy arrays,
``numba.cuda``), built from the element function of the group's registry entry
(``opt.fused_kernel(group)``, a ``minidist.optim.registry.FusedStep``). ``step`` below is the
same for every entry. The CPU kernel computes exactly the bits of the default path (the same
operations in the same order, one rounding each); on the GPU a multiply-add may be fused into
one rounding (last-bit differences). ``foreach=True`` (torch's multi-tensor path) takes the
same kernels: torch's foreach and fused steps are both "many tensors per launch".

Flat buffers. A kernel call costs a few microseconds on the CPU and tens on a GPU, so the step
is not one call per tensor when it can be fewer: parameters are sorted by address and cut into
*runs* whose parameter, gradient and state arrays each continue exactly where the previous
one's ended, and each run is ONE call over flat views::

    params   |--p0--|--p1--|--p2--|      |--p3--|     (p0..p2 live in one flat buffer)
    grads    |--g0--|--g1--|--g2--|  |--g3--|         (e.g. a DDP bucket)
    exp_avg  |--m0--|--m1--|--m2--|--m3--|            (allocated flat on the first step)
    runs     [ one call over p0..p2 (flat)  ] [ p3 ]

The optimizer state is allocated that way (one flat buffer per state name and group, views in
``state``, so ``state_dict()`` is unchanged); parameters and gradients are the model's. Tensors
the kernels cannot take (float16 on the CPU, non-contiguous views, mixed dtypes) and every
parameter of a machine without Numba take the default path, with the same results; kernels
that fail to compile or first launch fall back as ``minidist.kernels.fallback`` decides (one
warning, then the same element function on whole arrays, ``optim_math.*_reference``).

``flatten_parameters(model.parameters())`` puts a model's parameters into one flat buffer (per
device and dtype) and reserves their gradients in a second one with the same layout, in
REVERSE parameter order, which is the order DDP fills its gradient buckets: without DDP a
fused step is then one call for the whole model; with DDP (whose buckets then receive the
gradients) one call per bucket. Call it before building DDP and the optimizer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from minidist import xp as backend
from minidist.kernels import optim_math
from minidist.kernels.fallback import CompiledBackend
from minidist.logger import get_logger, rank_prefix
from minidist.optim import multi_tensor
from minidist.optim.registry import FusedStep

log = get_logger(__name__)

__all__ = ["check_flags", "step", "reference_update", "implementation", "flatten_parameters",
           "flat_runs", "kernel_calls"]

_KERNEL_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def check_flags(name: str, foreach: bool | None, fused: bool | None) -> None:
    """torch's rule: ``fused`` and ``foreach`` cannot both be True."""
    if fused and foreach:
        raise RuntimeError(f"{rank_prefix()} {name}: `fused` and `foreach` cannot be `True` "
                           "together. Pass fused=True (one compiled pass) or foreach=True.")


# ----------------------------------------------------------------- backends (lazy)
# The kernels module is imported on first use; a failure to load, compile or first launch
# (rehearsed on private copies, before any parameter is touched) gives one RuntimeWarning and
# the whole-array reference from then on: minidist.kernels.fallback's policy.

_CPU = CompiledBackend("numba-cpu optimizer", "minidist.kernels.optim_cpu",
                       "Install numba (`pip install numba`) for the fused CPU step.")
_CUDA = CompiledBackend("numba-cuda optimizer", "minidist.kernels.optim_cuda",
                        "Install numba-cuda for your CUDA version (`pip install "
                        "'numba-cuda[cu12]'`) for the fused GPU step.")


def _kernels_for(array: Any) -> CompiledBackend:
    return _CUDA if backend.is_device_array(array) else _CPU


def kernel_calls() -> int:
    """How many compiled (or fallback) kernel calls the fused steps made so far, CPU and GPU
    together: a benchmark's count of launches per optimizer step."""
    return _CPU.calls + _CUDA.calls


def implementation(array: Any) -> str:
    """``"numba-cpu"``, ``"numba-cuda"`` or ``"default"``: what ``fused=True`` runs for arrays
    like ``array``.

    >>> import numpy as np
    >>> implementation(np.zeros(3, np.float32)) in ("numba-cpu", "default")
    True
    """
    chosen = _kernels_for(array)
    if chosen.get() is None:
        return "default"
    return "numba-cuda" if chosen is _CUDA else "numba-cpu"


# ----------------------------------------------------------------- flat runs

def _address(a: Any) -> int:
    if backend.is_device_array(a):
        return int(a.data.ptr)
    return int(a.__array_interface__["data"][0])


def _root(a: Any) -> Any:
    """The allocation ``a`` views (NumPy: the base that owns the memory; CuPy: its memory)."""
    if backend.is_device_array(a):
        return a.data.mem
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a.base if a.base is not None else a


def _kernel_ready(arrays: tuple[Any, ...]) -> bool:
    """Can the kernels take these arrays: one dtype (float32/64), C-contiguous, one module?"""
    first = arrays[0]
    if first.dtype not in _KERNEL_DTYPES:
        return False
    if all(type(a) is np.ndarray for a in arrays):  # the common case, fast
        return all(a.dtype == first.dtype and a.flags.c_contiguous for a in arrays)
    device = backend.is_device_array(first)
    for a in arrays:
        if a.dtype != first.dtype or not a.flags.c_contiguous or \
                backend.is_device_array(a) != device:
            return False
    return True


def _flat_span(first: Any, numel: int) -> Any:
    """A 1-D view of ``numel`` elements starting at ``first`` (checked to be one allocation)."""
    if backend.is_device_array(first):
        cupy = backend.get_array_module(first)
        return cupy.ndarray((numel,), first.dtype, memptr=first.data)
    return np.lib.stride_tricks.as_strided(first.reshape(-1), shape=(numel,),
                                           strides=(first.itemsize,))


def flat_runs(items: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Merge items (tuples of same-dtype contiguous arrays, column k of each item a parameter's
    k-th array) into runs where every column is one allocation, back to back; return one tuple
    of flat 1-D arrays per run. Items are sorted by the first column's address first.

    Only views can be parts of a longer run: an item whose first two arrays own their memory
    (``base is None``: a model that was not flattened, fresh gradients) is a run of its own,
    found without reading any address (the cheap common case).

    >>> import numpy as np
    >>> p, g = np.zeros(5, np.float32), np.ones(5, np.float32)
    >>> runs = flat_runs([(p[2:], g[2:]), (p[:2], g[:2])])
    >>> [(a.size, b.size) for a, b in runs]
    [(5, 5)]
    """
    runs: list[tuple[Any, ...]] = []
    views = []
    for item in items:
        if item[0].base is None or item[1].base is None:
            runs.append(tuple(a.reshape(-1) for a in item))
        else:
            views.append(([_address(a) for a in item], item))
    views.sort(key=lambda entry: entry[0][0])
    start: tuple[Any, ...] = ()
    roots: list[Any] = []
    ends: list[int] = []
    numel = 0
    for addrs, item in views:
        if start and ends == addrs and all(_root(a) is r for a, r in zip(item, roots)):
            numel += item[0].size
        else:
            if start:
                runs.append(_span(start, numel))
            start, roots, numel = item, [_root(a) for a in item], item[0].size
        ends = [a0 + a.nbytes for a0, a in zip(addrs, item)]
    if start:
        runs.append(_span(start, numel))
    return runs


def _span(first: tuple[Any, ...], numel: int) -> tuple[Any, ...]:
    if numel == first[0].size:
        return tuple(a.reshape(-1) for a in first)
    return tuple(_flat_span(a, numel) for a in first)


def _flat_state(likes: list[Any]) -> list[Any]:
    """One flat zeroed buffer for arrays shaped like ``likes`` (same dtype/module), as views,
    in address order of ``likes`` (so runs over the parameters are runs over the state too)."""
    order = sorted(range(len(likes)), key=lambda k: _address(likes[k]))
    xp = backend.get_array_module(likes[0])
    flat = xp.zeros(sum(int(a.size) for a in likes), dtype=likes[0].dtype)
    views: list[Any] = [None] * len(likes)
    offset = 0
    for k in order:
        n = int(likes[k].size)
        views[k] = flat[offset:offset + n].reshape(likes[k].shape)
        offset += n
    return views


def flatten_parameters(params: Iterable[Any]) -> list[Any]:
    """Move every parameter's data into one flat buffer per (device, dtype), in reverse order,
    and reserve its gradient in a second flat buffer of the same layout; return the parameter
    buffers. Values are unchanged; ``p.array`` becomes a view of the buffer (so call this before
    anything keeps ``p.array``: DDP, the optimizer, AMP's master weights).

    >>> import numpy as np
    >>> from minidist import nn
    >>> model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    >>> [flat.size for flat in flatten_parameters(model.parameters())]
    [26]
    """
    from minidist.tensor import GradDestination

    groups: dict[tuple, list[Any]] = {}
    for p in reversed(list(params)):
        key = (backend.is_device_array(p.array), str(backend.device_of(p.array)), p.array.dtype)
        groups.setdefault(key, []).append(p)
    flats = []
    for ps in groups.values():
        xp = backend.get_array_module(ps[0].array)
        total = sum(int(p.array.size) for p in ps)
        flat = xp.empty(total, dtype=ps[0].array.dtype)
        grads = xp.zeros(total, dtype=ps[0].array.dtype)
        offset = 0
        for p in ps:
            n, shape = int(p.array.size), p.array.shape
            view = flat[offset:offset + n].reshape(shape)
            view[...] = p.array
            p.array = view
            if p.requires_grad:
                gview = grads[offset:offset + n].reshape(shape)
                if p.grad is not None:
                    gview[...] = p.grad.array
                    p.grad = gview
                p.grad_destination = GradDestination(gview)
            offset += n
        flats.append(flat)
        log.debug("flatten_parameters: %d parameters, %d elements of %s in one buffer",
                  len(ps), total, flat.dtype)
    return flats


# ----------------------------------------------------------------- the step

Update = Callable[[int, Any, dict[str, Any]], None]


# Options the kernels do not implement: a group that sets one takes the default path.
UNFUSED_OPTIONS = ("amsgrad", "maximize", "capturable", "differentiable")


def _entry_for(opt: Any, group: dict[str, Any]) -> FusedStep | None:
    """The registry entry that updates ``group`` (None: the optimizer's own rule)."""
    if not (group.get("fused") or group.get("foreach")):  # foreach shares the kernels
        return None
    if any(group.get(k) for k in UNFUSED_OPTIONS):
        return None
    return opt.fused_kernel(group)


def step(opt: Any, fallback: Update) -> None:
    """One fused step of ``opt``: each group's entry (``opt.fused_kernel(group)``) updates
    the parameters the kernels take; ``fallback(i, p, group)`` updates every other one
    (no fused option, float16 on the CPU, an option in ``UNFUSED_OPTIONS``, ...).

    Parameters are batched by (group, entry, backend, dtype, first update?, step number): one
    batch shares its scalars, computed once, and is one kernel call (``_launch``)."""
    batches: dict[tuple, list] = {}
    i = 0
    for group in opt.param_groups:
        entry = _entry_for(opt, group)
        for p in group["params"]:
            if p.grad is not None:
                kernels = None if entry is None else _kernels_for(p.array)
                if entry is None or kernels is None or kernels.get() is None or \
                        not _kernel_ready((p.array, p.grad.array)):
                    fallback(i, p, group)
                else:
                    state = opt.state[i]
                    first = not state
                    t = state.get("step", 0) + 1 if entry.counts_steps else 0
                    key = (id(group), id(kernels), p.array.dtype, first, t)
                    batches.setdefault(key, [group, entry, kernels, []])[3].append((i, p))
            i += 1
    for (_, _, dtype, first, t), (group, entry, kernels, members) in batches.items():
        if first and (entry.state or entry.counts_steps):
            _new_state(opt, entry, members)
        ready = []
        for i, p in members:
            s = opt.state[i]
            arrays = (p.array, p.grad.array, *(s[name] for name in entry.state))
            if _kernel_ready(arrays):
                if entry.counts_steps:
                    s["step"] = t
                ready.append(arrays)
            else:  # e.g. state loaded with another dtype
                fallback(i, p, group)
        scalars = _scalars(entry, group, t, first, dtype)
        _launch(kernels, entry, ready, scalars)


def _new_state(opt: Any, entry: FusedStep, members: list[tuple[int, Any]]) -> None:
    """The first update's state: ``"step": 0`` if counted, and one flat zeroed buffer per
    state name, as per-parameter views in the parameters' address order (so runs over the
    parameters are runs over the state too)."""
    likes = [p.array for _, p in members]
    columns = [_flat_state(likes) for _ in entry.state]
    for k, (i, _) in enumerate(members):
        s = opt.state[i]
        if entry.counts_steps:
            s["step"] = 0
        for name, views in zip(entry.state, columns):
            s[name] = views[k]


def _scalars(entry: FusedStep, group: dict[str, Any], t: int, first: bool,
             dtype: Any) -> tuple[Any, ...]:
    """The entry's scalars for one batch, cast to the parameters' dtype (flags stay bool), so
    the element computes in that dtype exactly as the default path does."""
    dt = np.dtype(dtype).type
    return tuple(x if isinstance(x, bool) else dt(x) for x in entry.scalars(group, t, first))


def reference_update(opt: Any, entry: FusedStep, i: int, p: Any, group: dict[str, Any]) -> None:
    """``entry``'s element on whole arrays, for one parameter: the default path of an
    optimizer that has a fused step and no ``_update`` of its own (the same bits as the CPU
    kernels; temporaries are allocated per step)."""
    state = opt.state[i]
    first = not state
    if first:
        if entry.counts_steps:
            state["step"] = 0
        xp = backend.get_array_module(p.array)
        for name in entry.state:
            state[name] = xp.zeros_like(p.array)
    t = 0
    if entry.counts_steps:
        t = state["step"] = state["step"] + 1
    scalars = _scalars(entry, group, t, first, p.array.dtype)
    optim_math.flat_step_reference(entry, p.array, p.grad.array,
                                   tuple(state[name] for name in entry.state), scalars)


MULTI_TENSOR = True
"""False: one kernel call per run, as before multi-tensor tables (benchmarks compare both)."""


def _launch(kernels: CompiledBackend, entry: FusedStep, ready: list[tuple[Any, ...]],
            scalars: tuple) -> None:
    """One kernel call for all tensors in ``ready`` (one dtype and device): a single flat run
    directly, several runs through a multi-tensor table of the tensors (``multi_tensor``;
    built from the tensors themselves, whose addresses it remembers); one call per run only
    when the addresses allow no table."""
    if not ready:
        return
    runs = flat_runs(ready)
    table = multi_tensor.table_of(ready) if len(runs) > 1 and MULTI_TENSOR else None
    if table is not None:
        kernels.call("multi_step", optim_math.multi_step_reference, entry, table.base,
                     table.offsets, table.max_numel, scalars)
        return
    for run in runs:
        kernels.call("flat_step", optim_math.flat_step_reference, entry, run[0], run[1],
                     run[2:], scalars)
