"""MPI's own all-reduce (algorithm "mpi"): the baseline every benchmark shows beside ours.

    mpi_all_reduce(transport, buf, ReduceOp.SUM)   # = MPI_Iallreduce(MPI_IN_PLACE, buf, ...)
    native_all_reduce(transport).all_reduce(buf, ReduceOp.SUM, tag)   # a plan's run

It only exists on the MPI transport (``transport.mpi`` is its ``MPIHandles``); elsewhere
``mpi_all_reduce`` raises a ValueError before anything is sent. MPI picks its own algorithm
inside (MPICH: recursive doubling for small messages, Rabenseifner or ring for large ones). The
call is non-blocking and waited with the transport's deadline.

MPI's Allreduce cannot carry a tag, so the fingerprint of the call (``tag`` from the process
group; ``has_fingerprint``) is guarded beside it: on one node each rank writes ``(call number,
fingerprint)`` into its line of the shared control window before posting and compares the
peers' lines after (or while) waiting (``ShmNode.guard``: shm_guard.py; stream 0
only: the small shared-memory all-reduce posts there too); across nodes, and on other
streams, a 2-word ``Iallreduce(MAX)`` of ``[fp, -fp]`` runs alongside the data. A difference is
``CollectiveMismatch`` on every rank, never a silently wrong sum (MPICH itself sums mismatched
dtypes and even counts silently).
"""

from __future__ import annotations

import math
import weakref
from typing import Any

import numpy as np

from minidist.comm.algorithms.registry import Algorithm, model
from minidist.comm.errors import CollectiveMismatch, CommError, CommTimeout
from minidist.comm.ops import ReduceOp, finalize
from minidist.comm.transports.base import MAX_STREAMS, STREAM_BITS, Transport, wait_until

_MPI_OPS = {ReduceOp.SUM: "SUM", ReduceOp.AVG: "SUM", ReduceOp.MAX: "MAX", ReduceOp.MIN: "MIN",
            ReduceOp.PROD: "PROD"}


def supports_native(transport: Transport) -> bool:
    """True when the transport can run MPI's own Allreduce."""
    return transport.mpi is not None


class NativeAllReduce:
    """MPI's Allreduce on one MPI transport, with the fingerprint guard and a deadline."""

    def __init__(self, transport: Transport) -> None:
        mpi = transport.mpi
        assert mpi is not None, f"{transport.name} transport has no MPI"
        self.transport, self.mpi, self.MPI = transport, mpi, mpi.MPI
        self.where = f"[rank {transport.rank}/{transport.size}]"
        self.in_place = self.MPI.IN_PLACE
        self.spin_tests = mpi.spin_tests  # Test() calls before the deadline-bounded wait
        self.comm = mpi.comm
        self.guard = np.zeros(2, np.int64)  # across nodes: [fp, -fp] reduced with MAX
        self.ops = [None] + [getattr(self.MPI, _MPI_OPS[op]) for op in ReduceOp]  # by op.code

    def all_reduce(self, buf: Any, op: ReduceOp, tag: int = 0,
                   timeout_s: float | None = None) -> None:
        """All-reduce ``buf`` in place: publish the fingerprint guard, post the ``Iallreduce``,
        wait with the deadline, check the guard, finalize AVG.

        One call at a time per transport (MPI issues the collectives of a communicator in
        program order, so they never overlap).
        """
        view, after = (buf, None) if type(buf) is np.ndarray else self.mpi.host_view(buf, True)
        k, guard_req = 0, None  # the guard: my call number in the shared lines, or a request
        if tag >> STREAM_BITS:  # has_fingerprint(tag): the ledger is on (no call on this path)
            # the shared guard lines serve stream 0 only, as the window's other users do
            node = None if tag & (MAX_STREAMS - 1) else self.mpi.guard_node
            if node is not None:
                k = node.guard.post(tag)  # my guard line in the shared window (shm_guard)
            else:
                self.guard[0], self.guard[1] = tag, -tag
                guard_req = self.comm.Iallreduce(self.in_place, self.guard, op=self.MPI.MAX)
        req = self.comm.Iallreduce(self.in_place, view, op=self.ops[op.code])
        try:
            # MPICH advances a non-blocking collective only inside MPI calls (no progress
            # thread): spin on Test() a while, then wait with the deadline and the failure poll
            for _ in range(self.spin_tests):
                if req.Test():
                    break
            else:
                self._wait(req, buf.nbytes, timeout_s, k, tag)
            if guard_req is not None:
                self._wait(guard_req, 16, timeout_s, 0, tag)
        except self.MPI.Exception as e:
            self._check_guard(k, tag, complete=True)
            raise CommError(f"{self.where} all_reduce(algorithm=\"mpi\", {buf.nbytes} bytes): "
                            f"MPI error {e}. Every rank must pass the same shape and dtype.") from e
        if k:
            if not self.mpi.guard_node.guard.agrees(k, tag):
                self._check_guard(k, tag, complete=True)
        elif guard_req is not None and (self.guard[0] != tag or self.guard[1] != -tag):
            raise CollectiveMismatch(
                f"{self.where} all_reduce(algorithm=\"mpi\"): another rank called a different "
                "collective here (its call fingerprint differs).")
        if after is not None:
            after()
        if op.averages:
            finalize(buf, op, self.transport.size)

    def _wait(self, req: Any, nbytes: int, timeout_s: float | None, k: int, tag: int) -> None:
        t = self.transport
        timeout_s = t.timeout_s if timeout_s is None else timeout_s

        def timed_out() -> CommTimeout:
            return CommTimeout(
                f"{self.where} all_reduce(algorithm=\"mpi\", {nbytes} bytes): not complete "
                f"after {timeout_s:.1f} s. Some rank did not join this MPI Allreduce; check "
                "every rank calls the same collectives in the same order (raise "
                "MINIDIST_TIMEOUT_S for slow steps).")

        hook = t.poll_hook

        def poll() -> Exception | None:
            if k:  # a peer that posted this call number with another fingerprint: fail now
                try:
                    self._check_guard(k, tag, complete=False)
                except CollectiveMismatch as e:
                    return e
            return None if hook is None else hook(None, tag)
        wait_until(req.Test, timeout_s, timed_out, poll)

    def _check_guard(self, k: int, tag: int, complete: bool) -> None:
        if not k:
            return
        bad = self.mpi.guard_node.guard.mismatch(k, tag, complete)
        if bad:
            raise CollectiveMismatch(
                f"{self.where} all_reduce(algorithm=\"mpi\"): rank"
                f"{'s' if len(bad) > 1 else ''} {', '.join(map(str, bad))} called a different "
                "collective as this MPI call (its call fingerprint differs).")


_NATIVE: "weakref.WeakKeyDictionary[Transport, NativeAllReduce]" = weakref.WeakKeyDictionary()


def native_all_reduce(transport: Transport) -> NativeAllReduce:
    """The transport's NativeAllReduce (made on first use). Raises ValueError without MPI."""
    native = _NATIVE.get(transport)
    if native is None:
        if not supports_native(transport):
            raise ValueError(
                f"[rank {transport.rank}/{transport.size}] all_reduce(algorithm=\"mpi\"): the "
                f"{transport.name!r} transport has no MPI Allreduce. Use algorithm='ring', "
                "'tree', 'rd', 'direct' or 'auto', or run with backend='mpi' under mpiexec.")
        native = _NATIVE[transport] = NativeAllReduce(transport)
    return native


def mpi_all_reduce(transport: Transport, buf: Any, op: ReduceOp, tag: int = 0) -> None:
    """All-reduce ``buf`` in place with MPI's Iallreduce; ``tag``'s fingerprint is guarded."""
    native_all_reduce(transport).all_reduce(buf, op, tag)


def mpi_check(transport: Transport) -> None:
    """An explicit ``algorithm="mpi"`` on a transport without MPI: the clear error, at once."""
    if not supports_native(transport):
        native_all_reduce(transport)  # raises


def mpi_usable(transport: Transport, buf: Any, stream: int) -> bool:
    """"auto" may pick "mpi" on the MPI transport (any buffer it can read, any stream)."""
    return transport.mpi is not None


def mpi_prepare(transport: Transport, buf: Any) -> Any:
    """``run(buf, op, tag)`` for a plan (``Algorithm.prepare``): the transport's
    ``NativeAllReduce.all_reduce``, MPI's Iallreduce with its guard and deadline."""
    return native_all_reduce(transport).all_reduce


def mpi_cost(n: int, k: float, a: float, b: float, g: float) -> float:
    """Modelled time: 2 ceil(log2 n) latencies, 2K(n-1)/n bytes sent, K(n-1)/n reduced."""
    return 2 * math.ceil(math.log2(n)) * a + 2 * k * (n - 1) / n * b + k * (n - 1) / n * g


MPI = Algorithm("mpi", mpi_all_reduce, usable=mpi_usable, cost=mpi_cost,
                constants=model(3.0, 3.0e-4), prepare=mpi_prepare, check=mpi_check)

__all__ = ["mpi_all_reduce", "native_all_reduce", "supports_native", "NativeAllReduce", "MPI"]
