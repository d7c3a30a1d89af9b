"""An element function on whole arrays, in place: traced once, written out as ufunc calls.

    >>> import numpy as np
    >>> from minidist.optim.sgd import SGD_MOMENTUM
    >>> scalars = (0.1, 0.9, 1.0, 0.0, False, False)    # lr, momentum, 1 - dampening, ...
    >>> plan = plan_for(SGD_MOMENTUM, scalars, np.zeros(3, np.float32))
    >>> print(plan.source)
    def sgd_momentum_inplace(p, g, state, scratch, i, scalars):
        buf = state['momentum_buffer']
        work0 = scratch(i, p, 0)
        lr, momentum, keep, weight_decay, nesterov, first = scalars
        xp.multiply(buf, momentum, out=buf)
        xp.add(buf, g, out=buf)
        xp.multiply(buf, lr, out=work0)
        xp.subtract(p, work0, out=p)
    <BLANKLINE>

An optimizer's maths is written once, as its element function (``sgd_momentum_element`` in
``minidist/optim/sgd.py``; the contract is in ``minidist/kernels/optim_math.py``): the fused
kernels compile it, and the default path (``Optimizer._update``) runs it on whole arrays. Run
on arrays as it is, every ``*`` and ``+`` would allocate a new array; so it runs once on
*tracers* that record each operation, and the record is written out as ufunc calls whose
results go into the parameter, its state arrays or reusable work buffers
(``Optimizer.scratch``). A step then allocates nothing and computes the kernels' bits (the same
operations in the same order); ``plan.source`` is what runs.

Branches (``if weight_decay != 0``, ``if first``) are decided while tracing, so a plan holds
for the steps whose scalars take the same branches: ``plan_key`` names them (each flag, and
whether each number is 0 or 1). An element that compares a number with anything else is traced
again for each new set of scalars. One that does what a plan cannot hold (arithmetic between
scalars, an array in a condition) runs as it is on whole arrays, with temporaries.

Where a value goes: into its destination (the new parameter into ``p``, a new state into its
array) when nothing reads the old value any more; else into a destination whose new value
comes after this value's last read; else into a work buffer nobody reads any more (or a new
one). A new value that found its destination busy, or that is an input (``buf = g`` on SGD's
first step), is copied there at the end.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, NamedTuple

import numpy as np

from minidist import xp as backend
from minidist.optim.registry import FusedStep

__all__ = ["Plan", "Untraceable", "plan_for", "plan_key", "PLANS"]


class Untraceable(Exception):
    """The element does something a plan cannot replay."""


class Plan(NamedTuple):
    """``run(p, g, state, scratch, i, scalars)``: one update of parameter ``i`` in place (its
    ``n_work`` work buffers from ``scratch``, ``Optimizer.scratch``); ``source`` its text;
    ``scalars`` and ``array_type``: what it was asked for (a caller keeps it while they stay
    the same)."""

    run: Callable[..., None]
    source: str
    n_work: int
    scalars: tuple[Any, ...]
    array_type: type


PLANS: dict[tuple, Plan] = {}
"""``(plan_key(entry, scalars), xp, array type)`` -> its plan."""


def plan_for(entry: FusedStep, scalars: tuple[Any, ...], like: Any) -> Plan:
    """The plan of ``entry`` for these scalars on arrays like ``like`` (NumPy or CuPy): traced
    on first use, then kept in ``PLANS`` (unless its branches are not all named by
    ``plan_key``)."""
    xp = backend.get_array_module(like)
    key = (plan_key(entry, scalars), xp, type(like))
    found = PLANS.get(key)
    if found is None:
        try:
            found, cacheable = _trace(entry, scalars, xp, type(like))
        except Untraceable:
            found, cacheable = _as_it_is(entry, type(like)), True
        if cacheable:
            PLANS[key] = found
    return found._replace(scalars=scalars)


def plan_key(entry: FusedStep, scalars: tuple[Any, ...]) -> tuple:
    """What decides an element's branches: each flag, and whether each number is 0 or 1."""
    return (entry, *[s if isinstance(s, bool) else (s == 0, s == 1) for s in scalars])


class _Trace:
    def __init__(self) -> None:
        self.ops: list[tuple[str, tuple[Any, ...], Value]] = []
        self.cacheable = True

    def record(self, name: str, operands: tuple[Any, ...]) -> Value:
        for x in operands:
            if not isinstance(x, (Value, Number, int, float)):
                raise Untraceable(f"an operand of {name} is a {type(x).__name__}")
        result = Value(self, len(self.ops))
        self.ops.append((name, operands, result))
        return result


class Value:
    """An array of the trace: an input (``index`` -1) or the result of op ``index``."""

    def __init__(self, trace: _Trace, index: int) -> None:
        self.trace, self.index = trace, index

    def __add__(self, o: Any) -> Value:
        return self.trace.record("add", (self, o))

    def __radd__(self, o: Any) -> Value:
        return self.trace.record("add", (o, self))

    def __sub__(self, o: Any) -> Value:
        return self.trace.record("subtract", (self, o))

    def __rsub__(self, o: Any) -> Value:
        return self.trace.record("subtract", (o, self))

    def __mul__(self, o: Any) -> Value:
        return self.trace.record("multiply", (self, o))

    def __rmul__(self, o: Any) -> Value:
        return self.trace.record("multiply", (o, self))

    def __truediv__(self, o: Any) -> Value:
        return self.trace.record("divide", (self, o))

    def __rtruediv__(self, o: Any) -> Value:
        return self.trace.record("divide", (o, self))

    def __neg__(self) -> Value:
        return self.trace.record("negative", (self,))

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Value:
        """``np.sqrt(v)``, ``np.maximum(a, b)``, ...: recorded as that ufunc."""
        if method != "__call__" or kwargs:
            raise Untraceable(f"{ufunc.__name__}.{method} with {sorted(kwargs)}")
        return self.trace.record(ufunc.__name__, inputs)

    def __bool__(self) -> bool:
        raise Untraceable("an array in a condition")


class Number:
    """A scalar of the trace: slot ``slot``, this step's ``value``; a comparison is a branch."""

    __hash__ = None  # type: ignore[assignment]

    def __init__(self, trace: _Trace, slot: int, value: Any) -> None:
        self.trace, self.slot, self.value = trace, slot, value

    def _branch(self, other: Any, result: bool) -> bool:
        if isinstance(other, (bool, Number)) or other not in (0, 1):  # not in plan_key
            self.trace.cacheable = False
        return result

    def __eq__(self, o: Any) -> bool:  # type: ignore[override]
        return self._branch(o, self.value == o)

    def __ne__(self, o: Any) -> bool:  # type: ignore[override]
        return self._branch(o, self.value != o)

    def __bool__(self) -> bool:
        return self._branch(0, self.value != 0)

    def __lt__(self, o: Any) -> bool:
        return self._branch(None, self.value < o)

    def __gt__(self, o: Any) -> bool:
        return self._branch(None, self.value > o)


def _trace(entry: FusedStep, scalars: tuple[Any, ...], xp: Any,
           array_type: type) -> tuple[Plan, bool]:
    """``entry.element`` traced with these scalars and written out (see the module docstring);
    also whether every branch it took is named by ``plan_key``."""
    n_arrays = 2 + len(entry.state)
    trace = _Trace()
    inputs = [Value(trace, -1) for _ in range(n_arrays)]
    numbers = [s if isinstance(s, bool) else Number(trace, k, s) for k, s in enumerate(scalars)]
    try:
        outputs = entry.element(*inputs, *numbers)
    except (TypeError, AttributeError) as e:
        raise Untraceable(f"{entry.name}: {e}") from None
    if len(outputs) != n_arrays - 1 or not all(isinstance(v, Value) for v in outputs):
        raise Untraceable(f"{entry.name}: the element must return arrays (new_p, *new_state)")
    dests = [0, *range(2, n_arrays)]                     # new_p -> p, new state k -> state k
    where, n_work, copies = _allocate(trace, inputs, dict(zip(dests, outputs)))

    params = [q for q in inspect.signature(entry.element).parameters.values()
              if q.kind is q.POSITIONAL_OR_KEYWORD]
    names = [q.name for q in params[:n_arrays + len(scalars)]]
    names += [f"s{k}" for k in range(len(names) - n_arrays, len(scalars))]
    works = [f"work{k}" for k in range(n_work)]
    if len(set(names + works + ["xp", "state", "scratch", "i", "scalars"])) != \
            len(names) + n_work + 5:
        raise Untraceable(f"{entry.name}: its parameter names clash with the plan's")

    def name(x: Any) -> str:
        if isinstance(x, Value):
            kind, k = where[id(x)]
            return names[k] if kind == "a" else works[k]
        return names[n_arrays + x.slot] if isinstance(x, Number) else repr(x)

    title = entry.name if entry.name.isidentifier() else "update"
    lines = [f"def {title}_inplace({names[0]}, {names[1]}, state, scratch, i, scalars):"]
    lines += [f"    {names[2 + k]} = state[{key!r}]" for k, key in enumerate(entry.state)]
    lines += [f"    {work} = scratch(i, {names[0]}, {k})" for k, work in enumerate(works)]
    if scalars:
        lines.append(f"    {', '.join(names[n_arrays:])}{',' * (len(scalars) == 1)} = scalars")
    for op, operands, v in trace.ops:
        lines.append(f"    xp.{op}({', '.join(name(x) for x in operands)}, out={name(v)})")
    for dest, (kind, k) in copies:
        lines.append(f"    xp.positive({names[k] if kind == 'a' else works[k]}, "
                     f"out={names[dest]})  # a copy")
    source = "\n".join(lines) + "\n"
    namespace: dict[str, Any] = {"xp": xp}
    exec(compile(source, f"<minidist.optim.inplace {entry.name}>", "exec"), namespace)
    run = namespace[f"{title}_inplace"]
    return Plan(run, source, n_work, (), array_type), trace.cacheable


def _as_it_is(entry: FusedStep, array_type: type) -> Plan:
    """An element no plan can hold, on whole arrays as it is (temporaries allocated): the
    scalars in the parameter's dtype, as the kernels take them."""
    def run(p: Any, g: Any, state: dict[str, Any], scratch: Any, i: int,
            scalars: tuple[Any, ...]) -> None:
        states = [state[name] for name in entry.state]
        dtype = np.dtype(p.dtype).type
        new = entry.element(p, g, *states, *[x if isinstance(x, bool) else dtype(x)
                                             for x in scalars])
        for a, value in zip(states, new[1:]):
            a[...] = value
        p[...] = new[0]
    return Plan(run, f"{entry.name}: the element on whole arrays, as it is", 0, (), array_type)


def _allocate(trace: _Trace, inputs: list[Value], home: dict[int, Value]
              ) -> tuple[dict[int, tuple[str, int]], int, list[tuple[int, tuple[str, int]]]]:
    """Where each value goes (see the module docstring): ``("a", k)`` input array k, or
    ``("w", k)`` work buffer k; array ``dest`` receives ``home[dest]``. Returns the places by
    ``id(value)``, the number of work buffers, and the copies ``(dest, place)`` at the end."""
    end = len(trace.ops)
    last = {id(v): -1 for v in inputs}                       # the op that reads it last
    for j, (_, operands, _) in enumerate(trace.ops):
        for x in operands:
            if isinstance(x, Value):
                last[id(x)] = j
    for v in home.values():
        last[id(v)] = end
    needed_at = {dest: (v.index if v.index >= 0 else end) for dest, v in home.items()}
    holder: dict[tuple[str, int], Value] = {("a", k): v for k, v in enumerate(inputs)}
    where: dict[int, tuple[str, int]] = {id(v): ("a", k) for k, v in enumerate(inputs)}
    n_work = 0
    for j, (_, _, v) in enumerate(trace.ops):
        free = [b for b, held in holder.items() if last[id(held)] <= j]
        mine = [("a", d) for d, out in home.items() if out is v and ("a", d) in free]
        spare = [b for b in free if b[0] == "a" and b[1] in needed_at and
                 last[id(v)] <= needed_at[b[1]] and last[id(v)] < end]
        work = [b for b in free if b[0] == "w"]
        if mine or spare or work:
            place = (mine or spare or work)[0]
        else:
            place, n_work = ("w", n_work), n_work + 1
        holder[place], where[id(v)] = v, place
    copies = [(dest, where[id(out)]) for dest, out in home.items() if where[id(out)] != ("a", dest)]
    copies.sort(key=lambda c: c[1][0] != "a")                # from the inputs first
    for c, (dest, _) in enumerate(copies):
        if any(source == ("a", dest) for _, source in copies[c + 1:]):
            raise Untraceable("the element swaps arrays")    # e.g. returns (buf, p)
    return where, n_work, copies
