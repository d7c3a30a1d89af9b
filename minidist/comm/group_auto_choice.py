"""ProcessGroup's questions to the planner's chooser: what ``algorithm="auto"`` picks, and why.

    group.auto_choice(grad)            # ("ring", "bandwidth: ..."): what all_reduce would run
    group.auto_table()                 # what "auto" picks at every power-of-two size
    group.use_calibration(cal)         # a ``python -m minidist.tune`` result, every rank alike

They ask the planner's chooser (planner.py: ``TextbookChoice`` in the spine alone, the auto
wing's rules and calibration by default). ``ProcessGroup`` (group.py) binds each as its method.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from minidist.comm.ops import ReduceOp
from minidist.comm.validate import flat_view

if TYPE_CHECKING:
    from minidist.comm.group import ProcessGroup


def auto_table(self: ProcessGroup) -> dict:
    """What ``algorithm="auto"`` will pick on this group at every power-of-two size.

    JSON-able (the chooser's ``table``; the auto wing's says whether a calibration or the
    shipped table decides), plus the group's backend and transport; not collective (the
    shared-memory facts and the calibration were settled when the group was made).
    """
    return {"backend": self.backend, "transport": self.transport.name,
            "num_nodes": self.topology.num_nodes, **self.planner.chooser.table()}


def auto_source(self: ProcessGroup) -> str:
    """Which table ``algorithm="auto"`` uses on this group: ``"calibration <file>"`` (a
    ``python -m minidist.tune`` result every rank holds) or the shipped table."""
    return self.planner.chooser.source()


def use_calibration(self: ProcessGroup, calibration: Any) -> None:
    """Make "auto" on this group use ``calibration`` (a ``calibrate.Calibration``; None:
    the shipped table). Every rank must pass the same one, as ``calibrate`` returns it."""
    self.planner.chooser.use_calibration(calibration)


def auto_choice(self: ProcessGroup, array: Any) -> tuple[str, str]:
    """``(algorithm, reason)``: what ``all_reduce(array)`` with "auto" runs, and why; not
    collective, sends nothing."""
    flat = flat_view(self, array, "auto_choice", writable=False)
    plan = self.planner.plan("auto", flat, ReduceOp.SUM)
    return plan.algorithm, plan.reason


__all__ = ["auto_table", "auto_source", "use_calibration", "auto_choice"]
