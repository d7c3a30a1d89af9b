"""Whether the shared-memory all-reduce can run here, and what it says when ranks disagree.

    shm_available(transport)            # collective on first call: MPI, one real node?
    shm_usable(transport, buf, stream)  # may "auto" pick "shm" for this call (planning)
    raise_mismatch(node, headers)       # CollectiveMismatch naming the first rank that differs
    describe(header)                    # "numel=10, dtype=float32, op=sum"

The header every rank writes before a call (minidist/fastpath/shm.py) encodes the dtype by its
index in ``DTYPES`` and the op by its ``ReduceOp.code``; a mismatch is decoded from ``DTYPES``
and ``OPS``.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from minidist.comm.errors import CollectiveMismatch, CommError
from minidist.comm.ops import ReduceOp
from minidist.comm.topology import detect_topology
from minidist.comm.transports.base import Transport
from minidist.fastpath.shm_window import ShmNode, shm_node, shm_owns

OPS = {op.code: op for op in ReduceOp}  # a header's op code -> the op
DTYPES = ["float16", "float32", "float64", "int32", "int64", "int8", "uint8", "int16"]
# A header's dtype code: equal for equal dtypes (``dtype.num`` differs for int64 'l' vs 'q'),
# 100 + ``dtype.num`` for any other dtype; a dict hit (``dtype.name`` is slow in NumPy 2.x).
DTYPE_CODES = {np.dtype(name): i for i, name in enumerate(DTYPES)}


def describe(x: list) -> str:
    """``numel=.., dtype=.., op=..`` of a header's first three words."""
    dt = DTYPES[x[1]] if x[1] < len(DTYPES) else f"dtype#{x[1] - 100}"
    return f"numel={x[0]}, dtype={dt}, op={OPS[x[2]].value if x[2] in OPS else x[2]}"


def raise_mismatch(node: ShmNode, h: list) -> None:
    """CollectiveMismatch naming the first rank whose header differs from mine."""
    mine = h[node.rank]
    for j, other in enumerate(h):
        if other[:3] != mine[:3]:
            raise CollectiveMismatch(
                f"{node.prefix} all_reduce(algorithm=\"shm\"): rank {j} passed "
                f"{describe(other)} but rank {node.rank} passed {describe(mine)}. Every rank "
                "must pass the same shape, dtype and op.")
        if other[6] != mine[6]:
            raise CollectiveMismatch(
                f"{node.prefix} all_reduce(algorithm=\"shm\"): rank {j} called a different "
                "collective here (its call fingerprint differs).")


def shm_available(transport: Transport, buf: Any = None) -> bool:
    """True when "shm" can run here: MPI transport, one (real, not virtually split) node, and
    (if given) a NumPy ``buf``.

    The first call per transport is collective (it splits the communicator by node), so call it
    on every rank alike, as ``ProcessGroup`` construction does; later calls are a dictionary lookup.
    """
    if buf is not None and not isinstance(buf, np.ndarray):
        return False
    ok = _AVAILABLE.get(transport)
    if ok is None:
        ok = False
        if (transport.size >= 2 and transport.mpi is not None
                and detect_topology(transport).is_single_node()):
            try:
                shm_node(transport)
                ok = True
            except CommError:  # ranks on several nodes: the same answer on every rank
                pass
        _AVAILABLE[transport] = ok
    return ok


def shm_is_shared(transport: Transport, buf: Any) -> bool:
    """True when ``buf`` lies in one of this rank's shared windows (shm_alloc_buffer)."""
    node = shm_node(transport)
    return isinstance(buf, np.ndarray) and shm_owns(node, buf)


_AVAILABLE: "weakref.WeakKeyDictionary[Transport, bool]" = weakref.WeakKeyDictionary()


def shm_usable(transport: Transport, buf: Any, stream: int) -> bool:
    """"auto" may pick "shm": the process group set up this transport's shared-memory node
    (``shm_available``), ``buf`` is a NumPy array and the call is on stream 0."""
    return type(buf) is np.ndarray and not stream and _AVAILABLE.get(transport, False)


__all__ = ["DTYPES", "DTYPE_CODES", "OPS", "raise_mismatch", "shm_available", "shm_is_shared",
           "shm_usable"]
