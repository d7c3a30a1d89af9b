"""The all-reduce planner: which algorithm runs for a call, and why, decided once per shape.

    planner = Planner(transport)                         # ProcessGroup makes one
    plan = planner.plan("auto", flat, ReduceOp.SUM)      # a Plan (memoized)
    plan.algorithm, plan.reason                          # "ring", "bandwidth: ..."
    plan.run(flat, ReduceOp.SUM, call.tag)               # runs it (transport bound)

One answer for everyone who asks: ``ProcessGroup.all_reduce`` runs the plan, and DDP names
``plan.algorithm`` of the same planner. An explicit algorithm runs as asked. "auto" is the
``chooser``'s question::

    spine alone       TextbookChoice: "ring" for every call
    the auto wing     minidist/auto/choice.py: rules, the alpha-beta model, the calibration
                      (it replaces ``planner.chooser`` when a group is made)

Two more seams, both empty in the spine: ``shared_bases`` (the ids of the arrays that back
the fast-path wing's shared-memory windows, where "auto" may reduce a buffer in place) and
``STAGERS`` (device buffers a transport cannot read, run through host memory). A training loop
repeats a few shapes, so plans are memoized per kind (a plain call's also by its arguments, in
``known``) and expire when the chooser's rules change (``forget_plans``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from minidist import wings
from minidist.comm.algorithms import ALGORITHMS
from minidist.comm.calls import CallSpec, call_spec
from minidist.comm.ops import ReduceOp
from minidist.comm.transports.base import Transport

MAX_PLANS = 256  # a model has a few bucket shapes; more means shapes change every call


@dataclass(frozen=True)
class Plan:
    """How one all-reduce shape runs.

    Attributes:
        algorithm: the algorithm that runs ("ring", "mpi", ...), never "auto".
        reason: why ("explicit", or the chooser's words for "auto").
        run: ``run(flat, op, tag)``: the algorithm on the group's transport (see ``_runner``).
        spec: what the call is (comm/calls.py ``CallSpec``: its fingerprint's signature, and
            what the ledger and the checks record), the same for every call of this shape.
        stager: the Stager (``STAGERS``) of a device buffer the transport cannot read, else None.
    """

    algorithm: str
    reason: str
    run: Callable[[Any, ReduceOp, int], None]
    spec: CallSpec
    stager: Any


def check_algorithm(name: str) -> None:
    """Raise ValueError unless ``name`` is "auto" or an algorithm of the registry (the caller
    adds the rank prefix)."""
    if name != "auto" and name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; use one of "
                         f"{', '.join(repr(k) for k in [*ALGORITHMS, 'auto'])}"
                         + wing_hint(name))


def wing_hint(name: str) -> str:
    """Where a known algorithm that is not registered lives (its wing is not loaded)."""
    wing = wings.ALGORITHM_WINGS.get(name)
    return (f" ({name!r} belongs to the {wing} wing, which MINIDIST_WINGS leaves out: unset "
            f"MINIDIST_WINGS or add {wing} to it)" if wing else "")

# A device buffer the transport cannot read: each stager_for(transport, flat, algorithm) returns
# a Stager (``all_reduce(flat, run_chunk)``) or None; the fast-path wing adds its own.
STAGERS: list[Callable[[Transport, Any, Any], Any]] = []


class Chooser(Protocol):
    """What "auto" asks (``Planner.chooser``); one whose rules change calls the planner's
    ``forget_plans``."""

    def choose(self, flat: Any, shared: bool, tag: int) -> tuple[str, str]:
        """``(algorithm, reason)`` for an all-reduce of ``flat`` on stream ``tag``."""


class TextbookChoice:
    """"auto" in the spine alone: the ring, the bandwidth-optimal textbook algorithm."""

    def choose(self, flat: Any, shared: bool, tag: int = 0) -> tuple[str, str]:
        """Always ``("ring", ...)``."""
        return "ring", "the textbook default (the auto wing is not loaded)"

    # What group_auto_choice.py asks of a chooser: what decides, the table, a calibration.
    def source(self) -> str:
        return "textbook default: ring (the auto wing is not loaded)"

    def table(self) -> dict:
        return {"source": self.source(), "sizes": []}

    def use_calibration(self, calibration: Any) -> None:
        if calibration is not None:
            raise ValueError("use_calibration: calibrations drive the auto wing, which "
                             "MINIDIST_WINGS leaves out (unset MINIDIST_WINGS or add auto)")


class Planner:
    """Plans of one process group (not collective: every input was settled at construction).

    Args:
        transport: the group's transport.

    Attributes:
        chooser: what "auto" runs (``TextbookChoice``; the auto wing sets its own).
        shared_bases: ``id`` of each array backing a shared window "auto" may reduce in
            place (the fast-path wing's live set; empty: none).
        known: the plain calls planned so far, by kind (ProcessGroup's ``_planned``).
    """

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self.size = transport.size
        self.chooser: Any = TextbookChoice()
        self.shared_bases: Any = frozenset()
        self._plans: dict = {}
        self.known: dict = {}

    def use_chooser(self, chooser: Any) -> None:
        """Plan "auto" with ``chooser`` from now on (see ``Chooser``)."""
        self.chooser = chooser
        self.forget_plans()

    def forget_plans(self) -> None:
        """Plan every shape afresh (the chooser's rules changed)."""
        self._plans.clear()
        self.known.clear()

    def plan(self, algorithm: str, flat: Any, op: ReduceOp, tag: int = 0) -> Plan:
        """The Plan of an all-reduce of ``flat`` (1-D) on stream ``tag`` (memoized).

        Raises:
            ValueError: unknown ``algorithm``, or one that cannot run on this transport at all
                (its entry's ``check``; nothing was sent).
        """
        # does flat lie in a window "auto" may reduce in place?
        shared = algorithm == "auto" and not tag and id(flat.base) in self.shared_bases
        key = (algorithm, flat.nbytes, flat.dtype, op.code, shared, not tag, type(flat))
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) >= MAX_PLANS:
                self.forget_plans()
            plan = self._plans[key] = self._make(algorithm, flat, op, shared, tag)
        return plan

    def _make(self, algorithm: str, flat: Any, op: ReduceOp, shared: bool, tag: int) -> Plan:
        if algorithm == "auto":
            name, reason = self.chooser.choose(flat, shared, tag)
        else:
            try:
                check_algorithm(algorithm)
            except ValueError as e:
                raise ValueError(f"[rank {self.transport.rank}/{self.size}] "
                                 f"all_reduce(algorithm={algorithm!r}): {e}.") from None
            name, reason = algorithm, "explicit"
            check = ALGORITHMS[name].check
            if check is not None:
                check(self.transport)  # its own clear error, before sending
        algo = ALGORITHMS[name]
        stager = self._stager(flat, algo)  # a device buffer this transport cannot read
        spec = call_spec("all_reduce", f'all_reduce(algorithm="{algorithm}")', flat.size,
                         flat.dtype, op, -1, name, reason, algorithm, shared)
        return Plan(name, reason, self._runner(algo, stager, flat, tag), spec, stager)

    def _stager(self, flat: Any, algo: Any) -> Any:
        for stager_for in STAGERS:
            stager = stager_for(self.transport, flat, algo)
            if stager is not None:
                return stager
        return None

    def _runner(self, algo: Any, stager: Any, flat: Any,
                tag: int) -> Callable[[Any, ReduceOp, int], None]:
        """``run(flat, op, tag)`` of ``algo`` on this transport: ``algo.run``, which checks its
        own preconditions at every call; prepared once for this size and dtype
        (``Algorithm.prepare``: "shm" holds its node, or a small buffer's mailboxes) when
        ``usable`` accepts this plan's buffer kind and stream; through host memory in chunks
        for a device buffer the transport cannot read (``stager``)."""
        transport = self.transport
        if stager is not None:
            def staged(flat: Any, op: ReduceOp, tag: int) -> None:
                stager.all_reduce(flat, lambda chunk: algo.run(transport, chunk, op, tag))
            return staged
        if algo.prepare is not None and algo.usable(transport, flat, tag):
            return algo.prepare(transport, flat)
        return functools.partial(algo.run, transport)

    def candidates(self, flat: Any, tag: int = 0) -> tuple:
        """The registry's algorithms "auto" may weigh for ``flat`` on stream ``tag``: the
        candidates with a cost model whose ``usable(transport, flat, tag)`` holds."""
        return tuple(name for name, a in ALGORITHMS.items()
                     if a.candidate and a.cost is not None
                     and a.usable(self.transport, flat, tag))


__all__ = ["Plan", "Planner", "Chooser", "TextbookChoice", "STAGERS", "check_algorithm",
           "wing_hint", "MAX_PLANS"]
