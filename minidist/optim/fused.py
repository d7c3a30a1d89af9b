"""Fused optimizer steps: one compiled pass per flat buffer instead of ~10 array ops per tensor.

    opt = optim.AdamW(model.parameters(), lr=1e-3, fused=True)    # torch's argument
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=True)

With ``fused=True`` the step of every float32/float64 parameter runs in the Numba kernels of
``minidist.kernels.optim_cpu`` (NumPy arrays, ``@njit``) or ``optim_cuda`` (CuPy arrays,
``numba.cuda``). The CPU kernel computes exactly the bits of the default path (the same
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

The optimizer state is allocated that way (one flat buffer per group, per-parameter views in
``state``, so ``state_dict()`` is unchanged); parameters and gradients are the model's. Tensors
the kernels cannot take (float16 on the CPU, non-contiguous views, mixed dtypes) and every
parameter of a machine without Numba take the default path, with the same results; kernels
that fail to compile or first launch fall back as ``minidist.kernels.fallback`` decides (one
warning, then the same element functions on whole arrays, ``optim_math.*_reference``).

``flatten_parameters(model.parameters())`` puts a model's parameters into one flat buffer (per
device and dtype) and reserves their gradients in a second one with the same layout, in
REVERSE parameter order, which is the order DDP fills its gradient buckets: without DDP a
fused step is then one call for the whole model; with DDP (whose buckets then receive the
gradients) one call per bucket. Call it before building DDP and the optimizer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from minidist import xp as backend
from minidist.kernels import optim_math
from minidist.kernels.fallback import CompiledBackend
from minidist.logger import get_logger, rank_prefix
from minidist.optim import multi_tensor

log = get_logger(__name__)

__all__ = ["check_flags", "sgd_step", "adam_step", "implementation", "flatten_parameters",
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
    buffers. Values are unchanged; ``p.data`` becomes a view of the buffer (so call this before
    anything keeps ``p.data``: DDP, the optimizer, AMP's master weights).

    >>> import numpy as np
    >>> from minidist import nn
    >>> model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    >>> [flat.size for flat in flatten_parameters(model.parameters())]
    [26]
    """
    from minidist.tensor import GradDestination

    groups: dict[tuple, list[Any]] = {}
    for p in reversed(list(params)):
        key = (backend.is_device_array(p.data), str(backend.device_of(p.data)), p.data.dtype)
        groups.setdefault(key, []).append(p)
    flats = []
    for ps in groups.values():
        xp = backend.get_array_module(ps[0].data)
        total = sum(int(p.data.size) for p in ps)
        flat = xp.empty(total, dtype=ps[0].data.dtype)
        grads = xp.zeros(total, dtype=ps[0].data.dtype)
        offset = 0
        for p in ps:
            n, shape = int(p.data.size), p.data.shape
            view = flat[offset:offset + n].reshape(shape)
            view[...] = p.data
            p.data = view
            if p.requires_grad:
                gview = grads[offset:offset + n].reshape(shape)
                if p.grad is not None:
                    gview[...] = p.grad
                    p.grad = gview
                p.grad_destination = GradDestination(gview)
            offset += n
        flats.append(flat)
        log.debug("flatten_parameters: %d parameters, %d elements of %s in one buffer",
                  len(ps), total, flat.dtype)
    return flats


# ----------------------------------------------------------------- the steps

Update = Callable[[int, Any, dict[str, Any]], None]


# Options the kernels do not implement: a group that sets one takes the default path.
UNFUSED_OPTIONS = ("amsgrad", "maximize", "capturable", "differentiable")


def _fused_params(opt: Any, fallback: Update) -> Iterable[tuple[int, Any, dict[str, Any], Any]]:
    """Yield ``(index, param, group, kernels)`` for the parameters the kernels take this step;
    the others (no fused, float16 on the CPU, an option in ``UNFUSED_OPTIONS``, ...) go
    through ``fallback`` right away."""
    for i, p, group in opt.indexed_params():
        if p.grad is None:
            continue
        multi = group.get("fused") or group.get("foreach")  # foreach shares the kernels
        fusable = multi and not any(group.get(k) for k in UNFUSED_OPTIONS)
        kernels = _kernels_for(p.data) if fusable else None
        if kernels is None or kernels.get() is None or not _kernel_ready((p.data, p.grad)):
            fallback(i, p, group)
            continue
        yield i, p, group, kernels


def _group_key(group: dict[str, Any], kernels: Any, dtype: Any, *more: Any) -> tuple:
    return (id(group), id(kernels), dtype) + more


def sgd_step(opt: Any, fallback: Update) -> None:
    """One fused SGD step over ``opt``'s fused groups (``fallback`` updates everything else)."""
    batches: dict[tuple, list] = {}
    for i, p, group, kernels in _fused_params(opt, fallback):
        buf = opt.state.get(i, {}).get("momentum_buffer") if group["momentum"] != 0 else p.data
        key = _group_key(group, kernels, p.data.dtype, buf is None)
        batches.setdefault(key, []).append([i, p, group, kernels, buf])
    for (_, _, dtype, first), entries in batches.items():
        if first:  # the first momentum step: the buffers, flat, in the params' address order
            for entry, buf in zip(entries, _flat_state([e[1].data for e in entries])):
                entry[4] = opt.state.setdefault(entry[0], {})["momentum_buffer"] = buf
        ready = []
        for i, p, group, _, buf in entries:
            if _kernel_ready((p.data, p.grad, buf)):
                ready.append((p.data, p.grad, buf))
            else:  # e.g. a buffer loaded with another dtype
                fallback(i, p, group)
        _, _, group, kernels, _ = entries[0]
        dt = np.dtype(dtype).type
        scalars = (dt(group["lr"]), dt(group["momentum"]), dt(1.0 - group["dampening"]),
                   dt(group["weight_decay"]), bool(group["nesterov"]), bool(first))
        _launch(kernels, "sgd", ready, scalars)


def adam_step(opt: Any, fallback: Update, decoupled: bool) -> None:
    """One fused Adam (``decoupled=False``) or AdamW step over ``opt``'s fused groups."""
    batches: dict[tuple, list] = {}
    for i, p, group, kernels in _fused_params(opt, fallback):
        state = opt.state.get(i)
        t = 1 if not state else state["step"] + 1
        key = _group_key(group, kernels, p.data.dtype, t)
        batches.setdefault(key, []).append((i, p, group, kernels))
    for (_, _, dtype, t), entries in batches.items():
        fresh = [(i, p) for i, p, _, _ in entries if not opt.state.get(i)]
        if fresh:  # first step: exp_avg / exp_avg_sq flat, in the params' address order
            likes = [p.data for _, p in fresh]
            for (i, _), m, v in zip(fresh, _flat_state(likes), _flat_state(likes)):
                opt.state[i] = {"step": 0, "exp_avg": m, "exp_avg_sq": v}
        _, _, group, kernels = entries[0]
        ready = []
        for i, p, _, _ in entries:
            s = opt.state[i]
            arrays = (p.data, p.grad, s["exp_avg"], s["exp_avg_sq"])
            if _kernel_ready(arrays):
                s["step"] = t
                ready.append(arrays)
            else:  # e.g. state loaded with another dtype
                fallback(i, p, group)
        dt = np.dtype(dtype).type
        lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
        beta1, beta2 = group["betas"]
        scalars = (dt(1.0 - lr * wd if decoupled else 1.0), dt(0.0 if decoupled else wd),
                   dt(beta1), dt(1.0 - beta1), dt(beta2), dt(1.0 - beta2),
                   dt(math.sqrt(1.0 - beta2 ** t)), dt(eps), dt(lr / (1.0 - beta1 ** t)))
        _launch(kernels, "adam", ready, scalars)


MULTI_TENSOR = True
"""False: one kernel call per run, as before multi-tensor tables (benchmarks compare both)."""

_REFERENCES: dict[str, Callable[..., Any]] = {
    "sgd_step": optim_math.sgd_step_reference,
    "adam_step": optim_math.adam_step_reference,
    "sgd_multi_step": optim_math.sgd_multi_step_reference,
    "adam_multi_step": optim_math.adam_multi_step_reference}


def _launch(kernels: CompiledBackend, name: str, ready: list[tuple[Any, ...]],
            scalars: tuple) -> None:
    """One kernel call for all tensors in ``ready`` (one dtype and device): a single flat run
    directly, several runs through a multi-tensor table of the tensors (``multi_tensor``;
    built from the tensors themselves, whose addresses it remembers); one call per run only
    when the addresses allow no table."""
    runs = flat_runs(ready)
    table = multi_tensor.table_of(ready) if len(runs) > 1 and MULTI_TENSOR else None
    if table is not None:
        op = f"{name}_multi_step"
        kernels.call(op, _REFERENCES[op], table.base, table.offsets, table.max_numel,
                     *scalars)
        return
    op = f"{name}_step"
    for run in runs:
        kernels.call(op, _REFERENCES[op], *run, *scalars)
