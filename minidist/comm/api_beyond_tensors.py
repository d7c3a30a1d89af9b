"""The module-level calls that move no tensor: sub-groups, small Python objects, the watch
wing's ledger and what "auto" picks. ``minidist.comm.api`` re-exports them.

    evens = minidist.new_group([0, 2])              # every rank calls it; None outside
    names = minidist.all_gather_object(socket.gethostname())
    for e in minidist.comm.get_ledger(last=3):
        print(e.seq, e.describe(), e.algorithm, e.reason, e.where, e.status)
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from minidist.comm.group import ProcessGroup


def _g(group: ProcessGroup | None) -> ProcessGroup:
    from minidist.comm.api import get_default_group
    return group if group is not None else get_default_group()


def new_group(ranks: list[int] | None = None, timeout: float | datetime.timedelta | None = None
              ) -> ProcessGroup | None:
    """A process group of some of the world's ranks, usable by every collective and by DDP.

    COLLECTIVE over the world: every rank calls it with the same ``ranks``, in the same order
    as its other ``new_group`` calls (torch's rule). Ranks keep their order: world rank
    ``ranks[i]`` is rank ``i`` of the new group (comm/subgroups.py).

    Returns:
        The new ProcessGroup on its member ranks; None on the others (torch returns a
        non-member marker there).

    Raises:
        ValueError: ``ranks`` are not distinct ranks of the world.
    """
    from minidist.comm.init_options import timeout_seconds

    world = _g(None)
    return world.new_group(ranks, timeout_seconds(timeout) if timeout is not None else None)


def broadcast_object(obj: Any = None, src: int = 0, group: ProcessGroup | None = None) -> Any:
    """Rank ``src``'s JSON-able ``obj`` on every rank."""
    return _g(group).broadcast_object(obj, src)


def all_gather_object(obj: Any, group: ProcessGroup | None = None) -> list:
    """Every rank's JSON-able ``obj``, as a list indexed by rank."""
    return _g(group).all_gather_object(obj)


def get_ledger(group: ProcessGroup | None = None, last: int | None = None) -> list[Any]:
    """The group's recorded collectives (``LedgerEntry``), oldest first (the last ``last``).

    Raises:
        RuntimeError: the group has no ledger (``MINIDIST_WINGS`` leaves the watch wing out).
    """
    g = _g(group)
    if g.ledger is None:
        raise RuntimeError(f"{g.where('get_ledger')}: the ledger belongs to the watch wing, "
                           "which MINIDIST_WINGS leaves out; unset MINIDIST_WINGS or add watch.")
    return g.ledger.entries(last=last)


def auto_table(group: ProcessGroup | None = None) -> dict:
    """What ``algorithm="auto"`` picks on the group at every power-of-two size (JSON-able).

    Not collective. Keys: ``backend``, ``transport``, ``world_size``, ``has_native``,
    ``has_shm``, ``candidates``, ``rules``, ``model``, ``sizes`` (per size: the algorithm, its
    reason and predicted microseconds, for a plain buffer and for a shared-window buffer).
    """
    return _g(group).auto_table()


__all__ = ["new_group", "broadcast_object", "all_gather_object", "get_ledger", "auto_table"]
