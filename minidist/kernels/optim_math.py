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
on scalars). The loops are the same for every entry; what differs, how many state arrays the
element reads and writes, is written out once per entry (``make_update`` below).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minidist import xp as backend

__all__ = ["sqrt", "make_update", "make_columns", "update_source", "columns_source",
           "flat_step_reference", "multi_step_reference", "rehearsal_table", "signature"]


# ----------------------------------------------------------------- what element functions call

def sqrt(x: Any) -> Any:
    """The square root for element functions: ``np.sqrt`` (arrays, NumPy scalars, ``@njit``;
    it keeps a float32 scalar float32); optim_cuda.py compiles it to ``math.sqrt``
    (``sqrt.rn.f32`` on float32: correctly rounded, like NumPy's)."""
    return np.sqrt(x)


# ----------------------------------------------------------------- the loop body, per entry
# The only part of a loop that depends on the entry is how many state arrays its element
# reads and writes. Numba cannot build a tuple from a generator (``*(a[i] for a in states)``),
# so the loop body is written out for the entry's count, from a short template, once per
# entry: for Adam's two state arrays ``make_update`` returns
#
#     def update(i, p, g, states, scalars):
#         s0, s1 = states
#         new = element(p[i], g[i], s0[i], s1[i], *scalars)
#         s0[i] = new[1]
#         s1[i] = new[2]
#         p[i] = new[0]
#
# and ``make_columns`` the slices of one multi-tensor table row:
#
#     def columns(base, row, n):
#         return base[row[0]:row[0] + n], base[row[1]:row[1] + n], (base[row[2]:row[2] + n],
#                                                                   base[row[3]:row[3] + n])
#
# Both backends compile these (``@njit``, ``cuda.jit(device=True)``) and loop over them; the
# simulator runs them as they are.

def make_update(element: Any, n_state: int) -> Any:
    """``update(i, p, g, states, scalars)``: element ``i`` of one flat run, in place, by
    ``element`` with ``n_state`` state arrays (``states``, a tuple)."""
    return _define("update", update_source(n_state), {"element": element})


def make_columns(n_state: int) -> Any:
    """``columns(base, row, n) -> (p, g, states)``: the arrays of one multi-tensor table row
    (``row``: the element offsets of p, g and each state array in ``base``), ``n`` long."""
    return _define("columns", columns_source(n_state), {})


def update_source(n_state: int) -> list[str]:
    """The lines of ``make_update``'s function (it calls a global ``element``); optim_cpu.py
    also writes them into a module of its own, which Numba can cache on disk."""
    names = [f"s{k}" for k in range(n_state)]
    lines = ["def update(i, p, g, states, scalars):"]
    if names:
        lines.append(f"    {', '.join(names)}, = states")
    reads = "".join(f"{name}[i], " for name in names)
    lines.append(f"    new = element(p[i], g[i], {reads}*scalars)")
    lines += [f"    {name}[i] = new[{k + 1}]" for k, name in enumerate(names)]
    lines.append("    p[i] = new[0]")
    return lines


def columns_source(n_state: int) -> list[str]:
    """The lines of ``make_columns``'s function."""
    spans = [f"base[row[{c}]:row[{c}] + n]" for c in range(2 + n_state)]
    states = "".join(f"{span}, " for span in spans[2:])
    return ["def columns(base, row, n):", f"    return {spans[0]}, {spans[1]}, ({states})"]


def _define(name: str, lines: list[str], namespace: dict[str, Any]) -> Any:
    source = "\n".join(lines) + "\n"
    exec(compile(source, f"<minidist.kernels.optim_math.{name}>", "exec"), namespace)
    function = namespace[name]
    function.source = source  # what was compiled, for a reader in a debugger
    return function


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
