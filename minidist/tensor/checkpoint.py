"""Activation checkpointing: trade compute for memory by recomputing a segment in backward.

    from minidist.utils import checkpoint
    h = checkpoint(block, x)          # block's activations are NOT kept; backward recomputes them

A plain forward keeps, for every op, what its backward needs (inputs, masks): the activations.
``checkpoint(fn, *args)`` runs ``fn`` under ``no_grad`` (nothing is kept but the inputs and the
output) and records ONE node on the tape whose backward re-runs ``fn`` with grad on and
differentiates that recomputation::

    forward                                   backward
    x --[ checkpoint(fn) ]--> y               g_y arrives at the checkpoint node
         no_grad: fn(x) -> y                  1. restore the RNG state saved at forward
         keeps: x, the RNG state              2. y' = fn(x') with grad on (x' = x, a new leaf)
         node parents: x + fn's parameters    3. grad(y', [x', params], g_y): RETURNED, not
                                                 accumulated, no hooks fire
                                              4. the outer walk routes them to x and the
                                                 parameters: .grad accumulates once, and each
                                                 post-accumulate-grad hook fires once (DDP)

Memory: the activations of ``fn`` exist only while its own backward runs, one segment at a
time. Cost: one extra forward of ``fn`` per step.

The parameters ``fn`` uses become parents of the node, so the outer backward counts their
edges (a parameter used inside and outside the segment still fires its hook once, after both
contributions) and DDP's ``find_unused_parameters`` walk reaches them. They are found from
``fn`` itself: a Module (``.parameters()``), a bound method of one, a ``functools.partial``,
or a closure over Modules, parameters or lists of them. A recomputation that reaches a tensor
requiring grad found in none of these raises (its gradient would be lost).

Randomness (dropout): the state of ``minidist.tensor.random``'s host generator is saved before
the forward and restored around the recomputation, so the recomputation draws the same mask;
the generator's state after backward is what it was before (``preserve_rng_state=True``).

Not allowed: ``fn`` must not modify its tensor inputs in place (the recomputation would see the
modified values). A change of an input's array (rebinding ``x.array``, or a change of its sum)
during the forward, or between forward and backward, raises.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Iterator

from minidist import xp as backend
from minidist.tensor import random
from minidist.tensor.autograd import grad
from minidist.tensor.core import Tensor, error
from minidist.tensor.grad_mode import enable_grad, is_grad_enabled, no_grad


def checkpoint(function: Callable[..., Tensor], *args: Any, use_reentrant: bool | None = None,
               context_fn: Callable[[], Any] | None = None, determinism_check: str = "default",
               debug: bool = False, early_stop: bool = True, preserve_rng_state: bool = True,
               **kwargs: Any) -> Tensor:
    """Run ``function(*args, **kwargs)`` without keeping its activations (torch's name).

    Args:
        function: returns one Tensor; a Module, a bound method of one, or a closure over the
            Modules/parameters it uses (see the module docstring for how they are found).
        *args: its inputs; Tensors among them get gradients as usual.
        use_reentrant: torch's choice between its two implementations; accepted (True, False
            or None) and never passed on: there is one mechanism here, which behaves like
            torch's ``use_reentrant=False`` (inputs need not require grad, keyword arguments
            reach ``function``).
        context_fn, debug: torch's options of the non-reentrant variant; only the defaults
            (None, False) are supported.
        determinism_check, early_stop: accepted ("default"/"none"; True/False): the
            recomputation is always checked (inputs unchanged) and always complete.
        preserve_rng_state: replay the same random draws (dropout masks) in the recomputation.
        **kwargs: passed to ``function`` (not differentiated).

    Returns:
        The output of ``function``: one node on the tape whose backward recomputes it.

    Raises:
        TypeError: ``function`` returned something other than a Tensor.
        RuntimeError: ``function`` modified an input in place, or used a tensor that requires
            grad that could not be found from ``function`` (in backward).

    Example::

        >>> from minidist import nn
        >>> from minidist.tensor import Tensor
        >>> from minidist.utils import checkpoint
        >>> block = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        >>> x = Tensor([[1.0, 2.0, 3.0, 4.0]], requires_grad=True)
        >>> checkpoint(block, x).sum().backward()
        >>> block[0].weight.grad.shape
        (4, 4)
    """
    if context_fn is not None or debug:
        raise ValueError(error("checkpoint", "context_fn and debug=True are not supported; "
                               "leave them at their defaults."))
    if determinism_check not in ("default", "none"):
        raise ValueError(error("checkpoint", f"determinism_check={determinism_check!r}: use "
                               "'default' or 'none'."))
    del use_reentrant, early_stop  # one mechanism: see the docstring
    if not is_grad_enabled():
        return function(*args, **kwargs)
    params = _parameters_of(function)
    tensor_args = [(i, a) for i, a in enumerate(args) if isinstance(a, Tensor)]
    rng_state = random.default_generator().bit_generator.state if preserve_rng_state else None
    seen = [(a, a.array, _fingerprint(a.array)) for _, a in tensor_args]
    with no_grad():
        out = function(*args, **kwargs)
    if not isinstance(out, Tensor):
        raise TypeError(error("checkpoint", f"function returned a {type(out).__name__}; "
                              "checkpoint supports functions that return one Tensor. Split "
                              "the function, or return a single Tensor."))
    _check_unchanged(seen, "during the checkpointed forward")
    inputs = [a for _, a in tensor_args if a.requires_grad]
    parents = tuple(inputs) + tuple(params)

    def backward(g: Any) -> tuple[Any, ...]:
        _check_unchanged(seen, "between the checkpointed forward and its backward")
        replay = list(args)
        leaves = []
        for i, a in tensor_args:
            replay[i] = Tensor(a.array, requires_grad=a.requires_grad)
            if a.requires_grad:
                leaves.append(replay[i])
        with _rng_replay(rng_state), enable_grad():
            out2 = function(*replay, **kwargs)
        if not out2.requires_grad:
            return (None,) * len(parents)
        _check_reached(out2, leaves + params)
        return grad(out2, leaves + params, g)

    return Tensor._make(out.array, parents, backward, "checkpoint")


def _parameters_of(function: Any) -> list[Tensor]:
    """Leaf tensors requiring grad that ``function`` can reach (see the module docstring)."""
    found: dict[int, Tensor] = {}

    def visit(obj: Any, depth: int) -> None:
        if isinstance(obj, Tensor):
            if obj.requires_grad and obj.is_leaf:
                found.setdefault(id(obj), obj)
        elif callable(getattr(obj, "parameters", None)) and not isinstance(obj, type):
            for p in obj.parameters():
                visit(p, depth)
        elif depth > 0 and isinstance(obj, (list, tuple)):
            for o in obj:
                visit(o, depth - 1)
        elif depth > 0 and isinstance(obj, functools.partial):
            for o in (obj.func, *obj.args, *obj.keywords.values()):
                visit(o, depth - 1)
        elif depth > 0 and callable(obj):
            visit(getattr(obj, "__self__", None), depth - 1)
            for cell in getattr(obj, "__closure__", None) or ():
                try:
                    visit(cell.cell_contents, depth - 1)
                except ValueError:  # an empty cell
                    pass

    visit(function, 3)
    return list(found.values())


def _check_reached(out: Tensor, allowed: list[Tensor]) -> None:
    """Every leaf requiring grad in the recomputed graph must be an input or a found parameter."""
    ok = {id(t) for t in allowed}
    stray, seen, stack = [], set(), [out]
    while stack:
        t = stack.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        if t.is_leaf:
            if t.requires_grad and id(t) not in ok:
                stray.append(t.shape)
            continue
        stack.extend(t._parents)
    if stray:
        raise RuntimeError(error(
            "checkpoint", f"the recomputed function used {len(stray)} tensor(s) that require "
            f"grad (shapes {stray[:4]}) that could not be found from the function, so their "
            "gradients would be lost. Pass a Module, a bound method of one, or a closure over "
            "the modules it uses; or pass those tensors as arguments."))


def _fingerprint(arr: Any) -> float:
    """A cheap summary of an input's values (one read pass): its sum in float64."""
    if arr.dtype.kind not in "fiub" or arr.size == 0:
        return 0.0
    return float(backend.get_array_module(arr).sum(arr, dtype="float64"))


def _check_unchanged(seen: list[tuple[Tensor, Any, float]], when: str) -> None:
    for k, (t, arr, fp) in enumerate(seen):
        now = _fingerprint(t.array)
        same = fp == now or (math.isnan(fp) and math.isnan(now))
        if t.array is not arr or not same:
            raise RuntimeError(error(
                "checkpoint", f"tensor input {k} (shape {t.shape}) was modified in place "
                f"{when} (sum {fp!r} -> {now!r}{', array replaced' if t.array is not arr else ''})"
                ". The recomputation in backward would see different values and give wrong "
                "gradients. Do not modify the inputs of a checkpointed function; compute a new "
                "tensor instead (y = x + 1, not x.array += 1)."))


class _rng_replay:  # noqa: N801 - a context manager used like a function
    """Set the host generator to ``state`` inside the block; restore its state after."""

    def __init__(self, state: dict | None) -> None:
        self.state = state

    def __enter__(self) -> None:
        if self.state is not None:
            self.gen = random.default_generator()
            self.after = self.gen.bit_generator.state
            self.gen.bit_generator.state = self.state

    def __exit__(self, *exc: object) -> None:
        if self.state is not None:
            self.gen.bit_generator.state = self.after


def segments_of(layers: list[Any], segments: int) -> Iterator[list[Any]]:
    """Split ``layers`` into ``segments`` consecutive runs of near-equal length (first longer)."""
    n = len(layers)
    if not 1 <= segments <= max(n, 1):
        raise ValueError(error("checkpoint_sequential", f"segments={segments} for {n} layers; "
                               f"use 1 <= segments <= {n}."))
    size, extra = divmod(n, segments)
    start = 0
    for s in range(segments):
        end = start + size + (1 if s < extra else 0)
        yield layers[start:end]
        start = end
