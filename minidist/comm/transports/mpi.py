"""The MPI transport: point-to-point byte messages through mpi4py.

    t = MPITransport()                  # dups COMM_WORLD, so user MPI traffic never collides
    t.sendrecv(a, right, b, left)       # Isend/Irecv([buf, MPI.BYTE]) on the raw bytes

Design notes:
- Buffers go to MPI as raw bytes (``[buf, MPI.BYTE]``), never as pickled objects; the receiver
  checks the byte count it got, so a shape mismatch between ranks is a CommError, not garbage.
- Every wait is bounded: it spins on ``Test()`` a few hundred times (the fast path, a few
  microseconds; only twice when ranks outnumber cores), then keeps testing with
  ``os.sched_yield()`` between tests (releases the GIL and the core) until ``timeout_s``, then
  raises CommTimeout naming rank, op, peer. In that slow phase a wait runs the ``poll_hook``
  every ``POLL_S`` (base.py), which reads the side channel: a second duplicate of the
  communicator (side.py), so failure notices are never blocked behind a stuck call.
- MPI-only code (MPI's own Allreduce, the "mpi" algorithm: minidist/fastpath/mpi_native.py;
  shared-memory windows) reaches MPI through ``t.mpi`` (mpi_handles.py).
- mpi4py is imported lazily (mpi_library.py): ``import minidist`` works without libmpi.
- GPU buffers (CuPy): the current stream is synchronized before MPI sees the buffer. They are
  staged through a host copy unless the MPI library is CUDA-aware: ``MINIDIST_CUDA_AWARE_MPI=1``
  forces the direct path, ``0`` staging, ``auto`` (default) asks ``mpi_cuda_aware()``. A
  wrong "yes" is a segfault, so unknown -> stage.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from minidist import xp as backend
from minidist.comm.env import cores_per_rank, ranks_on_this_node
from minidist.comm.transports import shm_files
from minidist.comm.errors import CommError, CommTimeout
from minidist.comm.transports.base import (DEFAULT_TIMEOUT_S, Request, Transport, poller,
                                           wait_until)
from minidist.comm.transports.mpi_handles import (MPIHandles, decide_cuda_aware,
                                                  host_view, machine_key, split_by_color,
                                                  split_members, wait_local)
from minidist.comm.transports.side import MPISideChannel
from minidist.comm.transports.mpi_library import (load_mpi, mpi_cuda_aware,  # noqa: F401
                                                  parse_cuda_aware_env)  # (re-exported)

SPIN_TESTS = 200  # Test() calls before the first yield: keeps small messages fast
# More ranks than cores: a spinning rank holds the core its peer needs, so spin only briefly
# (what it saves on small messages: docs/benchmarks.md).
OVERSUBSCRIBED_SPIN_TESTS = 2


def _wrong_count(t: "MPITransport", src: int, got: int, nbytes: int) -> CommError:
    return CommError(f"[rank {t.rank}/{t.size}] recv(src={src}): got {got} bytes but expected "
                     f"{nbytes}. Every rank must pass arrays of the same shape and dtype to a "
                     "collective.")


class _MPIRequest(Request):
    """A pending Isend/Irecv; ``wait`` polls ``Test()`` against a deadline."""

    __slots__ = ("t", "req", "op", "peer", "nbytes", "status", "after", "keep", "tag")

    def __init__(self, t: "MPITransport", req: Any, op: str, peer: int, nbytes: int,
                 status: Any = None, after: Any = None, keep: Any = None, tag: int = 0) -> None:
        self.t, self.req, self.op, self.peer, self.nbytes = t, req, op, peer, nbytes
        self.status, self.after, self.keep, self.tag = status, after, keep, tag

    def _test(self) -> bool:
        try:
            done = self.req.Test(self.status) if self.status is not None else self.req.Test()
        except self.t.MPI.Exception as e:
            raise CommError(f"[rank {self.t.rank}/{self.t.size}] {self.op}(peer={self.peer}): MPI "
                            f"error {e}. Every rank must pass the same shape and dtype.") from e
        if done:
            self._complete()
        return done

    def _complete(self) -> None:
        if self.status is not None:
            got = self.status.Get_count(self.t.MPI.BYTE)
            if got != self.nbytes:
                raise _wrong_count(self.t, self.peer, got, self.nbytes)
        if self.after is not None:
            self.after()
        self.req = None

    def test(self) -> bool:
        return self.req is None or self._test()

    def wait(self, timeout_s: float | None = None) -> None:
        if self.req is None:
            return
        for _ in range(self.t.spin_tests):
            if self._test():
                return
        timeout_s = self.t.timeout_s if timeout_s is None else timeout_s

        def timed_out() -> CommTimeout:
            return CommTimeout(
                f"[rank {self.t.rank}/{self.t.size}] {self.op}(peer={self.peer}, "
                f"{self.nbytes} bytes): not complete after {timeout_s:.1f} s. Nothing arrived "
                f"from rank {self.peer}; check every rank calls the same collectives in the "
                "same order (raise MINIDIST_TIMEOUT_S for slow steps).")
        wait_until(self.test, timeout_s, timed_out, poller(self.t, self.peer, self.tag))


class MPITransport(Transport):
    """Point-to-point over a duplicate of ``MPI.COMM_WORLD`` (or of the communicator given)."""

    name = "mpi"
    abort_ends_job = True  # MPI_Abort ends every rank

    def __init__(self, comm: Any = None, timeout_s: float | None = None) -> None:
        self.MPI = MPI = load_mpi()
        base = comm or MPI.COMM_WORLD
        self.rank, self.size = base.Get_rank(), base.Get_size()
        self.timeout_s = DEFAULT_TIMEOUT_S if timeout_s is None else float(timeout_s)
        what = f"[rank {self.rank}/{self.size}] MPITransport"
        self.comm, req = base.Idup()  # data messages and MPI's own collectives
        wait_local(req, self.timeout_s, what)
        self.side, req = base.Idup()  # failure notices: never blocked behind a stuck call
        wait_local(req, self.timeout_s, what)
        self.max_tag = int(base.Get_attr(MPI.TAG_UB))
        # Async collectives run on a worker thread while other threads may call MPI too.
        self.thread_safe = MPI.Query_thread() == MPI.THREAD_MULTIPLE
        self.side_channel = MPISideChannel(self)  # side.py
        self._cuda_aware_now: bool | None = None  # decided on the first device buffer
        self.spin_tests = (OVERSUBSCRIBED_SPIN_TESTS
                           if cores_per_rank(ranks_on_this_node(self.size)) < 1 else SPIN_TESTS)
        self.mpi = MPIHandles(MPI, self.comm, self.side, functools.partial(host_view, self),
                              functools.partial(machine_key, self),
                              functools.partial(split_by_color, self), MPI.COMM_WORLD.Get_rank(),
                              self.spin_tests)

    def cuda_aware(self) -> bool:
        """Whether device buffers go to MPI directly (decided once: mpi_handles.py)."""
        if self._cuda_aware_now is None:
            self._cuda_aware_now = decide_cuda_aware(self.rank)
        return self._cuda_aware_now

    # -- point to point ----------------------------------------------------------------------
    def isend(self, buf: Any, dst: int, tag: int = 0) -> Request:
        view, _ = host_view(self, buf, for_recv=False)
        self._count_sent(dst, view.nbytes)
        req = self.comm.Isend([view, self.MPI.BYTE], dst, tag)
        return _MPIRequest(self, req, "send", dst, view.nbytes, keep=view, tag=tag)

    def irecv(self, buf: Any, src: int, tag: int = 0) -> Request:
        view, after = host_view(self, buf, for_recv=True)
        req = self.comm.Irecv([view, self.MPI.BYTE], src, tag)
        return _MPIRequest(self, req, "recv", src, view.nbytes, status=self.MPI.Status(),
                           after=after, keep=view, tag=tag)

    def sendrecv(self, sendbuf: Any, dst: int, recvbuf: Any, src: int, tag: int = 0,
                 timeout_s: float | None = None) -> None:
        if backend.is_device_array(sendbuf) or backend.is_device_array(recvbuf):
            return super().sendrecv(sendbuf, dst, recvbuf, src, tag, timeout_s)
        # Host fast path (the ring's inner loop): raw requests, one Status, no wrapper objects
        # unless the spin phase runs out.
        byte = self.MPI.BYTE
        self._count_sent(dst, sendbuf.nbytes)
        rreq = self.comm.Irecv([recvbuf, byte], src, tag)
        sreq = self.comm.Isend([sendbuf, byte], dst, tag)
        status = self.MPI.Status()
        rdone = sdone = False
        try:
            for _ in range(self.spin_tests):
                rdone = rdone or rreq.Test(status)
                sdone = sdone or sreq.Test()
                if rdone and sdone:
                    break
        except self.MPI.Exception as e:
            raise CommError(f"[rank {self.rank}/{self.size}] sendrecv(dst={dst}, src={src}): MPI "
                            f"error {e}. Every rank must pass the same shape and dtype.") from e
        if not sdone:
            _MPIRequest(self, sreq, "send", dst, sendbuf.nbytes, tag=tag).wait(timeout_s)
        if not rdone:
            _MPIRequest(self, rreq, "recv", src, recvbuf.nbytes, status=status,
                        tag=tag).wait(timeout_s)
        elif status.Get_count(byte) != recvbuf.nbytes:
            raise _wrong_count(self, src, status.Get_count(byte), recvbuf.nbytes)

    def split(self, members: list[int], timeout_s: float) -> Transport | None:
        """A transport over an ``MPI_Comm_split`` of this one (collective over every rank)."""
        return split_members(self, members, timeout_s)

    def abort(self, code: int = 1) -> None:
        """End the whole job now (every rank), e.g. after an uncaught exception on this rank.

        MPI_Abort asks the process manager to end every rank, but MPICH may return from it
        (observed when it is called from a thread other than the main one) while the kill is
        on its way; this process must not run on meanwhile, so it exits at once itself.
        MPICH's shared-memory files would outlive the aborted job: they are removed first.
        """
        shm_files.unlink_mapped()
        self.MPI.COMM_WORLD.Abort(code)
        os._exit(code)

    def close(self) -> None:
        if not self.MPI.Is_finalized():
            for c in (self.comm, self.side):
                if c is not None:
                    c.Free()
        self.comm = self.side = self.mpi.comm = self.mpi.side = None
