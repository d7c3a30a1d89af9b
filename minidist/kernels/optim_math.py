"""The element function of a fused optimizer step: its contract, and what backends compile.

    new_p, new_buf = sgd_momentum_element(p, g, buf, lr, momentum, keep, weight_decay, nesterov,
                                          first)      # minidist/optim/sgd.py: scalars in, out
    flat_step_reference(entry, p, g, (buf,), scalars)  # the same function on whole arrays

A fused optimizer step is ONE scalar function per optimizer, its *element function*, written
beside the optimizer (``minidist/optim/<name>.py``) and registered with a ``FusedStep`` entry
(``minidist/optim/registry.py``). Its contract:

    element(p, g, *state, *scalars) -> (new_p, *new_state)

``p`` and ``g`` are one element of the parameter and its gradient, ``state`` one element of each
per-parameter state array (in the order of the entry's ``state`` names), ``scalars`` the
entry's scalars of this step (cast to the parameter's dtype; flags stay bools). Every value is
a scalar of the parameter's dtype (float32 or float64), so every operation rounds once in that
dtype. The same Python runs in four places, and gives the same bits in the three CPU ones:

    called on whole NumPy/CuPy arrays     flat_step_reference (the fallback; the default path of
                                          an optimizer that writes no ``_update`` of its own)
    compiled by optim_cpu.py              ``@njit`` loops: one over a flat run, one over a
                                          multi-tensor table (``minidist.optim.multi_tensor``)
    compiled by optim_cuda.py             ``@cuda.jit`` grid-stride twins of those loops
    run by Numba's CUDA simulator         the kernels' Python on NumPy scalars (tests)

Element functions may use Python arithmetic, comparisons, ``if`` and ``sqrt`` from this module
(``np.sqrt`` on arrays and in ``@njit``; ``math.sqrt`` in ``@cuda.jit``, which has no ``np.sqrt``
on scalars). The loops do not depend on how many state arrays an entry has: they pass
``*values_at(states, i)`` to the element and ``store_at(states, i, new[1:])`` back, where
``states`` is a tuple of arrays. Those helpers are written below for Python (the reference,
the simulator); each backend compiles them by the ``*_typed`` implementations, which unroll
the tuple at compile time (a Numba ``overload``: one specialization per tuple length).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minidist import xp as backend

__all__ = ["sqrt", "values_at", "store_at", "spans_at", "make_update", "TYPED_HELPERS",
           "flat_step_reference", "multi_step_reference", "rehearsal_table", "signature"]


# ----------------------------------------------------------------- what element functions call

def sqrt(x: Any) -> Any:
    """The square root for element functions: ``np.sqrt`` (arrays, NumPy scalars, ``@njit``;
    it keeps a float32 scalar float32); optim_cuda.py compiles it to ``math.sqrt``
    (``sqrt.rn.f32`` on float32: correctly rounded, like NumPy's)."""
    return np.sqrt(x)


# ----------------------------------------------------------------- tuple helpers of the loops

def values_at(arrays: tuple[Any, ...], i: Any) -> tuple[Any, ...]:
    """``(a[i] for a in arrays)`` as a tuple: element ``i`` of each state array."""
    return tuple(a[i] for a in arrays)


def store_at(arrays: tuple[Any, ...], i: Any, values: tuple[Any, ...]) -> None:
    """``a[i] = v`` for each state array and its new value."""
    for a, v in zip(arrays, values):
        a[i] = v


def spans_at(base: Any, row: Any, columns: tuple[int, ...], n: Any) -> tuple[Any, ...]:
    """``(base[row[c]:row[c] + n] for c in columns)``: one multi-tensor table row's arrays."""
    return tuple(base[row[c]:row[c] + n] for c in columns)


# Numba cannot build a tuple from a generator; these compile the helpers above for a given
# tuple length by recursion on the tuple (each length is one specialization, inlined).

def values_at_typed(arrays: Any, i: Any) -> Any:
    if len(arrays) == 0:
        def no_values(arrays: Any, i: Any) -> Any:
            return ()
        return no_values

    def first_and_rest(arrays: Any, i: Any) -> Any:
        return (arrays[0][i],) + values_at(arrays[1:], i)
    return first_and_rest


def store_at_typed(arrays: Any, i: Any, values: Any) -> Any:
    if len(arrays) == 0:
        def store_nothing(arrays: Any, i: Any, values: Any) -> None:
            return None
        return store_nothing

    def store_first_and_rest(arrays: Any, i: Any, values: Any) -> None:
        arrays[0][i] = values[0]
        store_at(arrays[1:], i, values[1:])
    return store_first_and_rest


def spans_at_typed(base: Any, row: Any, columns: Any, n: Any) -> Any:
    if len(columns) == 0:
        def no_spans(base: Any, row: Any, columns: Any, n: Any) -> Any:
            return ()
        return no_spans

    def first_and_rest(base: Any, row: Any, columns: Any, n: Any) -> Any:
        start = row[columns[0]]
        return (base[start:start + n],) + spans_at(base, row, columns[1:], n)
    return first_and_rest


TYPED_HELPERS = ((values_at, values_at_typed), (store_at, store_at_typed),
                 (spans_at, spans_at_typed))
"""(helper, its compiled implementation): what optim_cpu.py and optim_cuda.py register."""


def make_update(element: Any) -> Any:
    """``update(i, p, g, states, scalars)``: element ``i`` of one flat run, in place. Both
    backends compile it around their compiled ``element``, and loop over ``i``."""

    def update(i: Any, p: Any, g: Any, states: Any, scalars: Any) -> None:
        new = element(p[i], g[i], *values_at(states, i), *scalars)
        store_at(states, i, new[1:])
        p[i] = new[0]

    return update


# ----------------------------------------------------------------- whole-array references

def flat_step_reference(entry: Any, p: Any, g: Any, states: tuple[Any, ...],
                        scalars: tuple[Any, ...]) -> None:
    """``entry.element`` on whole NumPy/CuPy arrays, in place: what the kernels compute (the
    same operations in the same order: the same bits), used when they cannot run."""
    new = entry.element(p, g, *states, *scalars)
    for a, value in zip(states, new[1:]):
        a[...] = value
    p[...] = new[0]


def multi_step_reference(entry: Any, base: Any, table: Any, max_numel: int,
                         scalars: tuple[Any, ...]) -> None:
    """``flat_step_reference`` on each tensor of a multi-tensor table (row k: the element
    offsets of p, g and each state array in ``base``, then the numel)."""
    rows = backend.to_host(table, op="fused optimizer (the reference fallback reads its table)")
    for row in rows:
        n = int(row[-1])
        p, g, *states = (base[int(o):int(o) + n] for o in row[:-1])
        flat_step_reference(entry, p, g, tuple(states), scalars)


def rehearsal_table(xp: Any, dtype: Any, columns: int, numel: int) -> tuple[Any, Any]:
    """A small private ``(base, table)`` for rehearsing a multi-tensor op: two tensors of
    ``numel`` and 1 elements, each column its own stretch of ``base`` (random, finite)."""
    sizes = (numel, 1)
    total = columns * sum(sizes)
    base = xp.asarray(np.random.default_rng(0).uniform(0.5, 1.0, total).astype(dtype))
    rows, offset = [], 0
    for n in sizes:
        rows.append([offset + c * n for c in range(columns)] + [n])
        offset += columns * n
    return base, xp.asarray(np.array(rows, dtype=np.int64))


def signature(op: str, entry: Any, *args: Any) -> tuple:
    """What selects a compiled specialization (``minidist.kernels.fallback`` rehearses each
    once): the op, the entry, and the first array's type and dtype; every other array and
    scalar of a call has that dtype (``minidist.optim.fused`` makes sure), flags are bools,
    and the entry fixes how many arrays there are. Cheaper than the default signature."""
    first = args[0]
    return op, entry, type(first), first.dtype.char
