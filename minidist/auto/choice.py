"""What ``algorithm="auto"`` runs on one process group: the planner's chooser from this wing.

    group.planner.chooser.choose(flat, shared=False, tag=0)   # ("shm", "measured rule: ...")

``attach(group)`` (a group extension, comm/group.py) gives each new group an ``AutoChoice``
and the calibration every rank holds alike (``calibrate.agreed``, collective). How it
decides, in order::

    ranks on several nodes        -> "hier" (or "rd" for small messages)   select.choose_for_nodes
    a preferred registry entry    -> it, when usable ("cuda_ipc": device buffers on one node;
                                     its ``refine`` may hand small ones to "host_copy")
    otherwise                     -> the size rules, else the cheapest candidate by the
                                     alpha-beta model (select.choose_with_reason), from the
                                     calibration or the shipped table

With ``MINIDIST_DEBUG >= 1`` an observer of the group's calls logs, once per size class, the
choice, its reason and the predicted beside the measured time (``select.Explainer``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minidist.auto import calibrate, select
from minidist.comm.algorithms import ALGORITHMS
from minidist.comm.calls import CollectiveObserver
from minidist.logger import debug_level, get_logger

log = get_logger("minidist.comm.group")  # the logger these lines always came from

_SOURCES_SAID: set[tuple[str, int, str]] = set()  # (source, n, transport) logged already


class AutoChoice:
    """The chooser "auto" asks on one group (see the module docstring).

    Args:
        planner: the group's planner (its transport, and ``candidates``).
        num_nodes: how many nodes the group's ranks span.
        calibration: a ``calibrate.Calibration`` every rank holds alike, or None (shipped).
    """

    def __init__(self, planner: Any, num_nodes: int, calibration: Any = None) -> None:
        self.planner = planner
        self.transport = planner.transport
        self.size = planner.size
        self.num_nodes = num_nodes
        self.native = self.transport.mpi is not None  # MPI's own Allreduce ("mpi") runs here
        self.calibration = calibration
        self.explainer = select.Explainer(self.size, calibration)
        select.WATCHERS.add(self)

    def rules_changed(self) -> None:
        """``select`` changed its model or rules (``load_model``, a tune): plan afresh."""
        self.planner.forget_plans()

    def use_calibration(self, calibration: Any) -> None:
        """Decide from ``calibration`` from now on (None: the shipped table)."""
        self.calibration = calibration
        self.explainer.calibration = calibration
        self.planner.forget_plans()

    def source(self) -> str:
        """Which table decides, in words (``select.source``)."""
        return select.source(self.calibration)

    def choose(self, flat: Any, shared: bool, tag: int = 0) -> tuple[str, str]:
        """``(algorithm, reason)`` for ``flat``: the several-nodes rule, else the first usable
        ``preferred`` entry of the registry, else the cheapest candidate."""
        by_nodes = select.choose_for_nodes(self.num_nodes, flat.nbytes)
        if by_nodes is not None:  # several nodes: hier (or rd for small messages)
            return by_nodes
        for algo in ALGORITHMS.values():  # e.g. cuda_ipc for device buffers on one node
            if algo.preferred and algo.usable(self.transport, flat, tag):
                if algo.refine is not None:  # a measured rule may hand it on (host_copy)
                    return algo.refine(self.size, flat.nbytes, self.calibration)
                return algo.name, algo.preferred
        return select.choose_with_reason(self.size, flat.nbytes, self.native, False, shared,
                                         self.calibration, self.planner.candidates(flat, tag))

    def table(self) -> dict:
        """What "auto" picks at every power-of-two size (``select.table``, nodes applied)."""
        names = self.planner.candidates(np.zeros(1, np.float32))  # a host buffer, stream 0
        t = select.table(self.size, self.native, "shm" in names, calibration=self.calibration,
                         candidates=names)
        for row in t["sizes"]:  # several nodes: hier from HIER_MIN_BYTES up, rd below
            by_nodes = select.choose_for_nodes(self.num_nodes, row["nbytes"])
            if by_nodes is not None:
                row["plain"] = {"algorithm": by_nodes[0], "reason": by_nodes[1],
                                "predicted_us": None}
        return t


class ExplainAuto(CollectiveObserver):
    """``MINIDIST_DEBUG >= 1``: an observer of the group's calls (comm/calls.py) that hands
    each "auto" all-reduce's time (``call.t1 - call.t0``) to the chooser's
    ``select.Explainer``."""

    def __init__(self, chooser: AutoChoice) -> None:
        self.chooser = chooser

    def end(self, call: Any) -> None:
        """Give the explainer the time of an "auto" all-reduce."""
        spec = call.spec
        if spec.collective == "all_reduce" and spec.requested == "auto":
            self.chooser.explainer.add(spec.algorithm or "", spec.reason or "",
                                       spec.numel * np.dtype(spec.dtype).itemsize, spec.shared,
                                       call.t1 - call.t0)


class AutoExtension:
    """This wing on one group: the chooser, and the explanation flushed at the farewell."""

    def __init__(self, group: Any) -> None:
        self.chooser = AutoChoice(group.planner, group.topology.num_nodes)
        group.planner.use_chooser(self.chooser)
        self.chooser.use_calibration(calibrate.agreed(group))  # collective on MPI
        if debug_level() >= 1:
            group.calls.add(ExplainAuto(self.chooser))
        said = (self.chooser.source(), group.size, group.transport.name)
        if said not in _SOURCES_SAID:  # once per process and table (debug level)
            _SOURCES_SAID.add(said)
            log.debug("auto uses the %s (n=%d, transport %s)", *said)

    def farewell(self) -> None:
        """Log the size classes not explained yet."""
        self.chooser.explainer.flush()

    def close(self) -> None:
        """Nothing to release."""


def attach(group: Any) -> AutoExtension:
    """The group extension (comm/group.py ``GROUP_EXTENSIONS``) of this wing."""
    return AutoExtension(group)


__all__ = ["AutoChoice", "AutoExtension", "ExplainAuto", "attach"]
