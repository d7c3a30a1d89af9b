"""Debug mode's check that every rank passes the same collective, before any data moves.

    check_agreement(group, "all_reduce", flat, op, "ring", 0, row, stream)   # COLLECTIVE

With ``check_consistency=True`` (default: ``MINIDIST_DEBUG>=1``) each collective first
all-gathers (numel, dtype, op, algorithm, root) from every rank and raises CollectiveMismatch
naming the first rank that differs from rank 0. Without it, the fingerprints in the message
tags catch the same mistakes (a different count, dtype, op, root or collective never matches).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from minidist.comm.algorithms import ALGORITHMS
from minidist.comm.algorithms.ring import ring_all_gather
from minidist.comm.diagnosis.ledger import SEQ, fingerprint
from minidist.comm.errors import CollectiveMismatch
from minidist.comm.ops import SUPPORTED_DTYPES, ReduceOp
from minidist.comm.transports.base import wire_tag

_OPS = list(ReduceOp)


def check_agreement(group: Any, call: str, flat: Any, op: ReduceOp | None, algo: str,
                    root: int, row: list | None, stream: int) -> None:
    """Debug mode: all-gather (numel, dtype, op, algorithm, root) and compare with rank 0."""
    if not group.check_consistency or group.size == 1:
        return
    fields = ("numel", "dtype", "op", "algorithm", "root")
    algos = tuple(dict.fromkeys(("auto", *ALGORITHMS, "dissemination")))
    mine = [flat.size, SUPPORTED_DTYPES.index(flat.dtype.name),
            -1 if op is None else _OPS.index(op),
            algos.index(algo) if algo in algos else len(algos), root]
    table = np.zeros(group.size * len(mine), np.int64)
    table[group.rank * len(mine):(group.rank + 1) * len(mine)] = mine
    check = (fingerprint(row[SEQ], "consistency_check", None, None, 0, -1, None)
             if row is not None else 1)
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
                f"{group.where(call)}: rank {r} passed {fields[i]}={show(int(rows[r, i]))} "
                f"but rank 0 passed {fields[i]}={show(int(rows[0, i]))}. Every rank must pass "
                "the same shape, dtype, op and algorithm; check that all ranks build the same "
                "model and call the same collectives in the same order.")
            err.diagnosis = {"kind": "mismatch", "rank": r, "field": fields[i]}
            raise err


__all__ = ["check_agreement"]
