"""The all-reduce planner: which algorithm runs for a call, and why, decided once per shape.

    planner = Planner(transport, num_nodes, shm, calibration)   # ProcessGroup makes one
    plan = planner.plan("auto", flat, ReduceOp.SUM)              # a Plan (memoized)
    plan.algorithm, plan.reason                                  # "ring", "bandwidth: ..."
    plan.run(flat, ReduceOp.SUM, call.tag)                       # runs it (transport bound)

One answer for everyone who asks: ``ProcessGroup.all_reduce`` runs the plan, and DDP's trace
labels and run manifest name ``plan.algorithm`` of the same planner, so after ``python -m
minidist.tune`` both name the calibrated choice that ran.

How "auto" decides (select.py): ranks on several nodes -> "hier" (or "rd" for small
messages); a device buffer on one node with CUDA IPC -> "cuda_ipc" ("host_copy" below the
cut-over a calibration measured on a GPU: host_copy.choose_device); otherwise the size rules
and the alpha-beta model, from the calibration every rank holds alike (``calibrate.agreed``) or
the shipped table. A training loop repeats a few shapes, so plans are memoized per (algorithm,
bytes, dtype, op, shared window?, stream 0?, array type) and expire when the rules change
(``select.EPOCH``: ``load_model``, a tune).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from minidist.comm.algorithms import ALGORITHMS
from minidist.comm.algorithms import select
from minidist.comm.algorithms.mpi_native import mpi_all_reduce, supports_native
from minidist.comm.calls import CallSpec, call_spec
from minidist.comm.ops import ReduceOp
from minidist.comm.staging import Stager, stager_for
from minidist.comm.transports.base import Transport
from minidist.comm.transports.shm_window import shm_owns

MAX_PLANS = 256  # a model has a few bucket shapes; more means shapes change every call


@dataclass(frozen=True)
class Plan:
    """How one all-reduce shape runs.

    Attributes:
        algorithm: the algorithm that runs ("ring", "mpi", ...), never "auto".
        reason: why ("explicit", or select.py's words for "auto").
        run: ``run(flat, op, tag)``: the algorithm on the group's transport. "mpi" on an MPI
            transport calls MPI's Allreduce straight (mpi_native.py); a device buffer the
            transport cannot read runs through pinned host memory in chunks (``stager``).
        spec: what the call is (comm/calls.py ``CallSpec``: its fingerprint's signature, and
            what the ledger and the checks record), the same for every call of this shape.
        stager: comm/staging.py's Stager for such a device buffer, else None.
    """

    algorithm: str
    reason: str
    run: Callable[[Any, ReduceOp, int], None]
    spec: CallSpec
    stager: Stager | None


def check_algorithm(name: str) -> None:
    """Raise ValueError unless ``name`` is "auto" or an algorithm of the registry (the caller
    adds the rank prefix)."""
    if name != "auto" and name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; use one of "
                         f"{', '.join(repr(k) for k in [*ALGORITHMS, 'auto'])}")


class Planner:
    """Plans of one process group (not collective: every input was settled at construction).

    Args:
        transport: the group's transport.
        num_nodes: how many nodes its ranks span (topology).
        shm: the group's shared-memory node (algorithms/shm.py), or None.
        calibration: a ``calibrate.Calibration`` every rank holds alike, or None (shipped table).
    """

    def __init__(self, transport: Transport, num_nodes: int, shm: Any, calibration: Any) -> None:
        self.transport = transport
        self.size = transport.size
        self.num_nodes = num_nodes
        self.shm = shm
        self.native = supports_native(transport)
        self.calibration = calibration
        self._plans: dict = {}
        self._epoch = select.EPOCH

    def use_calibration(self, calibration: Any) -> None:
        """Plan "auto" from ``calibration`` from now on (None: the shipped table)."""
        self.calibration = calibration
        self._plans.clear()

    def is_shared(self, flat: Any, tag: int = 0) -> bool:
        """True when ``flat`` lies in a shared window "shm" can reduce in place (stream 0)."""
        return self.shm is not None and not tag and shm_owns(self.shm, flat)

    def plan(self, algorithm: str, flat: Any, op: ReduceOp, tag: int = 0) -> Plan:
        """The Plan of an all-reduce of ``flat`` (1-D) on stream ``tag`` (memoized).

        Raises:
            ValueError: unknown ``algorithm``, or "mpi" without MPI (nothing was sent).
        """
        if self._epoch != select.EPOCH:  # the model or rules changed (load_model, tune)
            self._plans.clear()
            self._epoch = select.EPOCH
        shared = algorithm == "auto" and self.is_shared(flat, tag)  # (matters to auto only)
        key = (algorithm, flat.nbytes, flat.dtype, op.code, shared, not tag, type(flat))
        plan = self._plans.get(key)
        if plan is None:
            plan = self._make(algorithm, flat, op, shared, tag)
            if len(self._plans) >= MAX_PLANS:
                self._plans.clear()
            self._plans[key] = plan
        return plan

    def _make(self, algorithm: str, flat: Any, op: ReduceOp, shared: bool, tag: int) -> Plan:
        if algorithm == "auto":
            name, reason = self.choose(flat, shared, tag)
        else:
            try:
                check_algorithm(algorithm)
            except ValueError as e:
                raise ValueError(f"[rank {self.transport.rank}/{self.size}] "
                                 f"all_reduce(algorithm={algorithm!r}): {e}.") from None
            name, reason = algorithm, "explicit"
            if name == "mpi" and not self.native:
                mpi_all_reduce(self.transport, flat, op, 0)  # the clear "no MPI here" error
        algo = ALGORITHMS[name]
        stager = stager_for(self.transport, flat, algo)  # device buffer, MPI not CUDA-aware
        spec = call_spec("all_reduce", f'all_reduce(algorithm="{algorithm}")', flat.size,
                         flat.dtype, op, -1, name, reason, algorithm, shared)
        return Plan(name, reason, self._runner(algo, stager, flat, tag), spec, stager)

    def _runner(self, algo: Any, stager: Stager | None, flat: Any,
                tag: int) -> Callable[[Any, ReduceOp, int], None]:
        """``run(flat, op, tag)`` of ``algo`` on this transport (see ``Plan.run``): prepared
        once (``Algorithm.prepare``: "mpi" calls MPI's Iallreduce straight, "shm" holds its
        node) when ``usable`` accepts this plan's buffer kind and stream, else ``algo.run``,
        which checks its own preconditions at every call (an explicit algorithm that cannot
        run here raises its own error then)."""
        transport = self.transport
        if stager is not None:
            def staged(flat: Any, op: ReduceOp, tag: int) -> None:
                stager.all_reduce(flat, lambda chunk: algo.run(transport, chunk, op, tag))
            return staged
        if algo.prepare is not None and algo.usable(transport, flat, tag):
            return algo.prepare(transport)
        return functools.partial(algo.run, transport)

    def candidates(self, flat: Any, tag: int = 0) -> tuple:
        """The registry's algorithms "auto" may weigh for ``flat`` on stream ``tag``: those
        of ``select.CANDIDATES`` whose ``usable(transport, flat, tag)`` holds."""
        return tuple(name for name in select.CANDIDATES
                     if ALGORITHMS[name].usable(self.transport, flat, tag))

    def choose(self, flat: Any, shared: bool, tag: int = 0) -> tuple[str, str]:
        """``(algorithm, reason)`` that "auto" picks for ``flat``: the several-nodes rule, else
        the first usable ``preferred`` entry of the registry, else the cheapest candidate."""
        by_nodes = select.choose_for_nodes(self.num_nodes, flat.nbytes)
        if by_nodes is not None:  # several nodes: hier (or rd for small messages)
            return by_nodes
        for algo in ALGORITHMS.values():  # e.g. cuda_ipc for device buffers on one node
            if algo.preferred and algo.usable(self.transport, flat, tag):
                if algo.refine is not None:  # a measured rule may hand it on (host_copy)
                    return algo.refine(self.size, flat.nbytes, self.calibration)
                return algo.name, algo.preferred
        return select.choose_with_reason(self.size, flat.nbytes, self.native, False, shared,
                                         self.calibration, self.candidates(flat, tag))

    def table(self) -> dict:
        """What "auto" picks at every power-of-two size (``select.table``, nodes applied)."""
        names = self.candidates(np.zeros(1, np.float32))  # a host buffer on stream 0
        t = select.table(self.size, self.native, "shm" in names, calibration=self.calibration,
                         candidates=names)
        for row in t["sizes"]:  # several nodes: hier from HIER_MIN_BYTES up, rd below
            by_nodes = select.choose_for_nodes(self.num_nodes, row["nbytes"])
            if by_nodes is not None:
                row["plain"] = {"algorithm": by_nodes[0], "reason": by_nodes[1],
                                "predicted_us": None}
        return t


__all__ = ["Plan", "Planner", "check_algorithm", "MAX_PLANS"]
