"""The ``*_object`` collectives: small JSON-able Python values, never pickle.

    names = group.all_gather_object({"host": h})    # [rank 0's dict, rank 1's, ...]
    cfg = group.broadcast_object(cfg, src=0)        # tuples come back as lists

``ProcessGroup`` binds them as its methods; they run on stream 0 through ``group.observed``
like the array collectives of collectives.py.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import numpy as np

from minidist.comm.algorithms.ring import ring_all_gather
from minidist.comm.algorithms.tree import tree_broadcast
from minidist.comm.calls import call_spec
from minidist.comm.errors import CommError
from minidist.comm.validate import root_rank

if TYPE_CHECKING:
    from minidist.comm.group import ProcessGroup


def _encode(group: ProcessGroup, obj: Any, call: str) -> np.ndarray:
    try:
        return np.frombuffer(json.dumps(obj).encode("utf-8"), dtype=np.uint8)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{group.where(call)}: the object is not JSON-serializable ({e}). "
                         "Send numbers, strings, lists and dicts only (arrays: use "
                         "broadcast/all_gather).") from None


def broadcast_object(group: ProcessGroup, obj: Any = None, src: int = 0) -> Any:
    """Rank ``src``'s ``obj`` on every rank (JSON round trip: tuples come back as lists)."""
    call = f"broadcast_object(src={src})"
    src = root_rank(group, src, "src", call)
    data, error = None, None
    if group.rank == src:
        try:
            data = _encode(group, obj, call)
        except ValueError as e:
            error = e
    buf = None
    with group.observed(call_spec("broadcast_object", call, root=src, algorithm="tree")) as c:
        # A length of -1 tells the other ranks that src failed, so they raise, not hang.
        length = np.array([-1 if error else (0 if data is None else data.size)], np.int64)
        if group.size > 1:
            tree_broadcast(group.transport, length, src, c.tag)
        if length[0] >= 0:
            buf = data.copy() if data is not None else np.empty(int(length[0]), np.uint8)
            if group.size > 1 and buf.size:
                tree_broadcast(group.transport, buf, src, c.tag)
    if error is not None:  # raised after the call ended: every rank raises alike, in step
        raise error
    if buf is None:
        raise CommError(f"{group.where(call)}: rank {src} could not encode its object (its "
                        "own error says why); nothing was broadcast.")
    return json.loads(buf.tobytes().decode("utf-8"))


def all_gather_object(group: ProcessGroup, obj: Any) -> list:
    """``[obj of rank 0, obj of rank 1, ...]`` on every rank (JSON: lengths, then bytes)."""
    call = "all_gather_object"
    data = _encode(group, obj, call)
    with group.observed(call_spec("all_gather_object", call, algorithm="ring")) as c:
        lengths = np.zeros(group.size, np.int64)
        lengths[group.rank] = data.size
        ring_all_gather(group.transport, lengths, c.tag)
        width = int(lengths.max())
        table = np.zeros(group.size * width, np.uint8)
        table[group.rank * width:group.rank * width + data.size] = data
        if width:
            ring_all_gather(group.transport, table, c.tag)
    return [json.loads(table[r * width:r * width + int(lengths[r])].tobytes().decode("utf-8"))
            for r in range(group.size)]


__all__ = ["broadcast_object", "all_gather_object"]
