"""Debug mode's check that every rank passes the same collective, before any data moves.

    group.calls.add(ConsistencyCheck(group))    # ProcessGroup does it with check_consistency

With ``check_consistency=True`` (default: ``MINIDIST_DEBUG>=1``) the process group registers
this observer of its calls (comm/calls.py): before each collective on arrays it all-gathers
(numel, dtype, op, algorithm, root) from every rank and raises CollectiveMismatch naming the
first rank that differs from rank 0. Without it, the fingerprints in the message tags catch the
same mistakes (a different count, dtype, op, root or collective never matches).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from minidist.comm.algorithms import ALGORITHMS
from minidist.comm.algorithms.ring import ring_all_gather
from minidist.comm.calls import Call, CollectiveObserver, fingerprint, wire_tag
from minidist.comm.errors import CollectiveMismatch
from minidist.comm.ops import SUPPORTED_DTYPES, ReduceOp

_OPS = list(ReduceOp)
CHECKED = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter")  # on arrays
FIELDS = ("numel", "dtype", "op", "algorithm", "root")


class ConsistencyCheck(CollectiveObserver):
    """The observer: ``start`` runs the check (COLLECTIVE); no other event."""

    def __init__(self, group: Any) -> None:
        self.group = group

    def start(self, call: Call) -> None:
        """Compare this call's arguments across ranks (a collective on arrays, 2+ ranks)."""
        spec = call.spec
        if spec.collective in CHECKED and self.group.size > 1:
            check_agreement(self.group, spec.text, spec.numel, spec.dtype, spec.op,
                            spec.requested, spec.root, call.seq, call.stream)


def check_agreement(group: Any, call: str, count: int, dtype: Any, op: ReduceOp | None,
                    algo: str | None, root: int, seq: int, stream: int) -> None:
    """All-gather (numel, dtype, op, algorithm, root) and compare with rank 0 (COLLECTIVE)."""
    algos = tuple(dict.fromkeys(("auto", *ALGORITHMS, "dissemination")))
    mine = [count, SUPPORTED_DTYPES.index(np.dtype(dtype).name),
            -1 if op is None else _OPS.index(op),
            algos.index(algo) if algo in algos else len(algos), max(root, 0)]
    table = np.zeros(group.size * len(mine), np.int64)
    table[group.rank * len(mine):(group.rank + 1) * len(mine)] = mine
    check = fingerprint(seq, "consistency_check", None, None, 0, -1, None)
    ring_all_gather(group.transport, table, wire_tag(stream, check, group.transport.max_tag))
    rows = table.reshape(group.size, len(mine))
    for r in range(1, group.size):
        diff = [i for i in range(len(mine)) if rows[r, i] != rows[0, i]]
        if diff:
            i = diff[0]
            shows: dict[int, Callable[[int], str]] = {
                0: lambda v: f"{v} elements", 1: lambda v: SUPPORTED_DTYPES[v],
                2: lambda v: _OPS[v].value if v >= 0 else "-",
                3: lambda v: algos[v] if v < len(algos) else "?", 4: str}
            show = shows[i]
            err = CollectiveMismatch(
                f"{group.where(call)}: rank {r} passed {FIELDS[i]}={show(int(rows[r, i]))} "
                f"but rank 0 passed {FIELDS[i]}={show(int(rows[0, i]))}. Every rank must pass "
                "the same shape, dtype, op and algorithm; check that all ranks build the same "
                "model and call the same collectives in the same order.")
            err.diagnosis = {"kind": "mismatch", "rank": r, "field": FIELDS[i]}
            raise err


__all__ = ["ConsistencyCheck", "check_agreement", "CHECKED"]
