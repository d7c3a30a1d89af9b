"""Sub-groups: a ProcessGroup of some of the ranks, usable by every collective and by DDP.

    evens = minidist.new_group([0, 2])        # every rank calls this
    if evens is not None:                     # None on ranks outside the group
        minidist.all_reduce(x, group=evens)

The transport's ``split`` makes the new group's transport: MPI splits its communicator
(``MPI_Comm_split``); TCP and threads give the group a view of the world's connections with a
tag space of its own (comm/transports/subgroup.py), so its messages never meet the world's.
``ProcessGroup.new_group`` is ``new_group`` below; ``minidist.new_group`` calls it on the world
(api_beyond_tensors.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from minidist.comm.group import ProcessGroup


def new_group(group: ProcessGroup, ranks: list[int] | None = None,
              timeout_s: float | None = None) -> Any:
    """A group of some of this group's ranks (``minidist.new_group`` on the world).

    COLLECTIVE over this group: every rank calls it with the same ``ranks`` in the same
    order as its other ``new_group`` calls. Rank ``ranks[i]`` is rank ``i`` of the new
    group; ranks outside ``ranks`` get None.

    Args:
        ranks: distinct ranks of this group (default: all of them).
        timeout_s: deadline of the new group's waits (default: this group's).

    Raises:
        ValueError: ``ranks`` are not distinct ranks of this group.
    """
    members = list(range(group.size)) if ranks is None else list(ranks)
    if len(set(members)) != len(members) or not members or any(
            isinstance(r, bool) or not isinstance(r, (int, np.integer))
            or not 0 <= r < group.size for r in members):
        raise ValueError(f"{group.where(f'new_group(ranks={ranks!r})')}: ranks must be "
                         f"distinct integers in [0, {group.size}), at least one.")
    members = [int(r) for r in members]
    if group.size == 1:
        return group
    group.drain()
    sub = group.transport.split(members, group.transport.timeout_s if timeout_s is None
                                else float(timeout_s))
    if sub is None:
        return None
    return type(group)(sub, algorithm=group.algorithm, backend=group.backend)


__all__ = ["new_group"]
