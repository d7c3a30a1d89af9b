"""MPI's own all-reduce (algorithm "mpi"): the baseline every benchmark shows beside ours.

    mpi_all_reduce(transport, buf, ReduceOp.SUM)   # = MPI_Iallreduce(MPI_IN_PLACE, buf, ...)

    native = native_all_reduce(transport)          # the process group's overlap:
    call = native.post(buf, ReduceOp.SUM, tag)     #   post, write the ledger row while the
    native.wait(call)                              #   data is in flight, then wait

It only exists on the MPI transport (``transport.mpi`` is its ``MPIHandles``); elsewhere
``mpi_all_reduce`` raises a ValueError before anything is sent. MPI picks its own algorithm
inside (MPICH: recursive doubling for small messages, Rabenseifner or ring for large ones). The
call is non-blocking and waited with the transport's deadline.

MPI's Allreduce cannot carry a tag, so the fingerprint of the call (``tag`` from the process
group; ``has_fingerprint``) is guarded beside it: on one node each rank writes ``(call number,
fingerprint)`` into its line of the shared control window before posting and compares the
peers' lines after (or while) waiting (``ShmNode.guard_post`` / ``guard_agrees``); across
nodes a 2-word ``Iallreduce(MAX)`` of ``[fp, -fp]`` runs alongside the data. A difference is
``CollectiveMismatch`` on every rank, never a silently wrong sum (MPICH itself sums mismatched
dtypes and even counts silently).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from minidist.comm.errors import CollectiveMismatch, CommError, CommTimeout
from minidist.comm.ops import ReduceOp, finalize
from minidist.comm.transports.base import Transport, has_fingerprint, wait_until

_MPI_OPS = {ReduceOp.SUM: "SUM", ReduceOp.AVG: "SUM", ReduceOp.MAX: "MAX", ReduceOp.MIN: "MIN",
            ReduceOp.PROD: "PROD"}


def supports_native(transport: Transport) -> bool:
    """True when the transport can run MPI's own Allreduce."""
    return transport.mpi is not None


@dataclass(slots=True)
class InFlight:
    """One posted MPI Allreduce, until ``NativeAllReduce.wait`` finishes it.

    Attributes:
        req: the data's ``Iallreduce`` request; ``done``: it completed at the post.
        guard_req: the ``[fp, -fp]`` Iallreduce (ranks on several nodes), or None.
        buf: the caller's array; ``view``: what MPI reduces (a host copy of a GPU array);
            ``after``: copies ``view`` back into ``buf`` (staged GPU arrays), or None.
        op: the reduction; AVG divides after the sum.
        k: the call number in the shared guard lines (0: no guard on one node).
        tag: the message tag that carries the fingerprint.
    """

    req: Any
    guard_req: Any
    buf: Any
    view: Any
    after: Any
    op: ReduceOp
    k: int
    tag: int
    done: bool


class NativeAllReduce:
    """MPI's Allreduce on one MPI transport, with the fingerprint guard and a deadline."""

    def __init__(self, transport: Transport) -> None:
        mpi = transport.mpi
        assert mpi is not None, f"{transport.name} transport has no MPI"
        self.transport, self.mpi, self.MPI = transport, mpi, mpi.MPI
        self.where = f"[rank {transport.rank}/{transport.size}]"
        self.in_place = self.MPI.IN_PLACE
        self.spin_tests = mpi.spin_tests  # Test() calls before the deadline-bounded wait
        self.guard = np.zeros(2, np.int64)  # across nodes: [fp, -fp] reduced with MAX
        self.ops = [None] + [getattr(self.MPI, _MPI_OPS[op]) for op in ReduceOp]  # by op.code

    def post(self, buf: Any, op: ReduceOp, tag: int = 0) -> InFlight:
        """Publish the fingerprint guard and post the ``Iallreduce``. Nothing else may run on
        this communicator before ``wait``."""
        view, after = (buf, None) if type(buf) is np.ndarray else self.mpi.host_view(buf, True)
        node, k, greq = self.mpi.guard_node, 0, None
        if has_fingerprint(tag):
            if node is not None:
                k = node.guard_post(tag)  # my guard line in the shared window (shm_window.py)
            else:
                self.guard[0], self.guard[1] = tag, -tag
                greq = self.mpi.comm.Iallreduce(self.in_place, self.guard, op=self.MPI.MAX)
        req = self.mpi.comm.Iallreduce(self.in_place, view, op=self.ops[op.code])
        # MPICH advances a non-blocking collective only inside MPI calls (no progress thread):
        # one Test() now sends this rank's data, so the caller's work until wait() overlaps
        # the transfer instead of delaying it.
        return InFlight(req, greq, buf, view, after, op, k, tag, req.Test())

    def wait(self, call: InFlight, timeout_s: float | None = None) -> None:
        """Finish a ``post``: wait with the deadline, check the guard, finalize AVG."""
        try:
            if not call.done:
                for _ in range(self.spin_tests):
                    if call.req.Test():
                        break
                else:
                    self._wait(call.req, call.view.nbytes, timeout_s, call.k, call.tag)
            if call.guard_req is not None:
                self._wait(call.guard_req, 16, timeout_s, 0, call.tag)
        except self.MPI.Exception as e:
            self._check_guard(call.k, call.tag, complete=True)
            raise CommError(f"{self.where} all_reduce(algorithm=\"mpi\", {call.view.nbytes} "
                            f"bytes): MPI error {e}. Every rank must pass the same shape and "
                            "dtype.") from e
        k = call.k
        if k:
            if not self.mpi.guard_node.guard_agrees(k, call.tag):
                self._check_guard(k, call.tag, complete=True)
        elif call.guard_req is not None and (self.guard[0] != call.tag
                                             or self.guard[1] != -call.tag):
            raise CollectiveMismatch(
                f"{self.where} all_reduce(algorithm=\"mpi\"): another rank called a different "
                "collective here (its call fingerprint differs).")
        if call.after is not None:
            call.after()
        if call.op is ReduceOp.AVG:
            finalize(call.buf, call.op, self.transport.size)

    def all_reduce(self, buf: Any, op: ReduceOp, tag: int = 0,
                   timeout_s: float | None = None) -> None:
        """``wait(post(buf, op, tag), timeout_s)``."""
        self.wait(self.post(buf, op, tag), timeout_s)

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
        bad = self.mpi.guard_node.guard_mismatch(k, tag, complete)
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


__all__ = ["mpi_all_reduce", "native_all_reduce", "supports_native", "NativeAllReduce",
           "InFlight"]
