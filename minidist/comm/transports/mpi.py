"""The MPI transport: point-to-point byte messages through mpi4py (MPI's Allreduce: mpi_native).

    t = MPITransport()                  # dups COMM_WORLD, so user MPI traffic never collides
    t.sendrecv(a, right, b, left)       # Isend/Irecv([buf, MPI.BYTE]) on the raw bytes
    t.mpi.comm                          # MPI-only code (minidist/fastpath/mpi_native.py, shm) uses this

Design notes:
- Buffers go to MPI as raw bytes (``[buf, MPI.BYTE]``), never as pickled objects; the receiver
  checks the byte count it got, so a shape mismatch between ranks is a CommError, not garbage.
- Every wait is bounded: it spins on ``Test()`` a few hundred times (the fast path, a few
  microseconds; only twice when ranks outnumber cores), then keeps testing with
  ``os.sched_yield()`` between tests (releases the GIL and the core; ``time.sleep(0)`` would
  sleep a whole scheduler tick) until ``timeout_s``, then raises CommTimeout naming rank, op, peer. MPI's own
  collectives are waited the same way (``Iallreduce``, ``Ibarrier``, ``Idup``): no call blocks
  without a deadline. In the slow phase a wait runs the ``poll_hook`` every ``POLL_S``
  (base.py), which reads the side channel: a second duplicate of the communicator (``side``)
  that only failure notices and farewells use, so it is never blocked behind a stuck call.
- MPI's own Allreduce (the "mpi" algorithm, with the fingerprint guard beside it) lives in
  ``minidist/fastpath/mpi_native.py``; it reaches MPI through ``t.mpi`` (MPIHandles).
- mpi4py is imported lazily (mpi_library.py): ``import minidist`` works without libmpi; only asking
  for MPI raises, with what to install.
- GPU buffers (CuPy): the current stream is synchronized before MPI sees the buffer (MPI cannot
  know about queued kernels). They are staged through a host copy unless the MPI library is
  CUDA-aware: ``MINIDIST_CUDA_AWARE_MPI=1`` forces the direct path, ``0`` forces staging, and
  ``auto`` (default) asks ``mpi_cuda_aware()``. A wrong "yes" is a segfault, so unknown -> stage.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from minidist import xp as backend
from minidist.comm.env import cores_per_rank, ranks_on_this_node
from minidist.comm.transports import shm_files
from minidist.comm.errors import CommError, CommTimeout
from minidist.comm.transports.base import (DEFAULT_TIMEOUT_S, Request, SideChannel, Transport,
                                           poller,
                                           stream_of, wait_until)
from minidist.comm.transports.mpi_library import (load_mpi, mpi_cuda_aware,  # noqa: F401
                                                  parse_cuda_aware_env)  # (re-exported)
from minidist.logger import get_logger
from minidist.envvars import env, raw

log = get_logger(__name__)

SPIN_TESTS = 200  # Test() calls before the first yield: keeps small messages fast
# More ranks than cores: a spinning rank holds the core its peer needs, so spin only briefly and
# give the core away with sched_yield (a system call; time.sleep(0) sleeps a scheduler tick).
# What it saves on small messages: docs/benchmarks.md, with the command that measures it.
OVERSUBSCRIBED_SPIN_TESTS = 2


@dataclass
class MPIHandles:
    """What MPI-only code needs of an MPI transport (``transport.mpi``; None elsewhere).

    Attributes:
        MPI: the ``mpi4py.MPI`` module.
        comm: the communicator of data messages and MPI's own collectives (a duplicate of
            ``COMM_WORLD`` or of the communicator given); shared-memory windows split it.
        side: the communicator of the side channel (failure notices, farewells).
        guard_node: the shared-memory node whose guard lines check MPI's Allreduce
            fingerprints when every rank shares one node (shm_window.py), else None.
        host_view: ``host_view(buf, for_recv) -> (array MPI sees, copy-back or None)``.
        machine_key: ``machine_key()``: ``COMM_WORLD`` rank of the lowest rank sharing my
            memory (collective; topology.py).
        split_by_color: ``split_by_color(color, key)``: an MPITransport over an
            ``MPI_Comm_split`` (collective; the "hier" algorithm's node transports).
        world_rank: this rank in ``COMM_WORLD`` (a sub-communicator's rank differs).
        spin_tests: ``Test()`` calls before a wait starts yielding the core.
    """

    MPI: Any
    comm: Any
    side: Any
    host_view: Any
    machine_key: Any
    split_by_color: Any
    world_rank: int
    spin_tests: int
    guard_node: Any = None  # the ShmNode when every rank shares one node (shm_window.py)


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


def _wait_local(req: Any, timeout_s: float, what: str) -> None:
    """Wait for an MPI request with a deadline but no side channel (it does not exist yet)."""
    def timed_out() -> CommTimeout:
        return CommTimeout(f"{what}: not every rank of the MPI job arrived within {timeout_s:g} "
                           "s. Start every rank with the same program, or raise "
                           "MINIDIST_TIMEOUT_S.")
    wait_until(req.Test, timeout_s, timed_out)


class _MPISideChannel(SideChannel):
    """The MPI side channel: messages on a second duplicate communicator (``side``)."""

    def __init__(self, t: "MPITransport") -> None:
        self.t = t

    def send(self, dst: int, kind: int, payload: bytes) -> None:
        t = self.t
        if t.side is None or dst == t.rank:
            return
        buf = np.frombuffer(bytes(payload), np.uint8)
        t._side_sends = [(r, b) for r, b in t._side_sends if not r.Test()]
        t._side_sends.append((t.side.Isend([buf, t.MPI.BYTE], dst, kind), buf))

    def try_recv(self, src: int, kind: int) -> bytes | None:
        t = self.t
        if t.side is None:
            return None
        status = t.MPI.Status()
        msg = t.side.Improbe(src, kind, status)
        if msg is None:
            return None
        buf = np.empty(status.Get_count(t.MPI.BYTE), np.uint8)
        req = msg.Irecv([buf, t.MPI.BYTE])

        def timed_out() -> CommTimeout:
            return CommTimeout(f"[rank {t.rank}/{t.size}] side channel: a message from "
                               f"rank {src} did not complete.")
        wait_until(req.Test, min(t.timeout_s, 5.0), timed_out)
        return buf.tobytes()

    def pending(self, kind: int) -> int | None:
        t = self.t
        if t.side is not None and t.side.Iprobe(t.MPI.ANY_SOURCE, kind, t._status):
            return t._status.Get_source()
        return None

    def stray_tag(self, src: int, tag: int) -> int | None:
        t = self.t
        if t.comm is not None and t.comm.Iprobe(src, t.MPI.ANY_TAG, t._status):
            other = t._status.Get_tag()
            if other != tag and stream_of(other) == stream_of(tag):
                return other
        return None


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
        _wait_local(req, self.timeout_s, what)
        self.side, req = base.Idup()  # failure notices: never blocked behind a stuck call
        _wait_local(req, self.timeout_s, what)
        self.max_tag = int(base.Get_attr(MPI.TAG_UB))
        # Async collectives run on a worker thread while other threads may call MPI too.
        self.thread_safe = MPI.Query_thread() == MPI.THREAD_MULTIPLE
        self._status = MPI.Status()
        self._side_sends: list = []  # (request, buffer) of side messages in flight
        self.side_channel = _MPISideChannel(self)
        self._cuda_aware_now: bool | None = None  # decided on the first device buffer
        self.spin_tests = (OVERSUBSCRIBED_SPIN_TESTS
                           if cores_per_rank(ranks_on_this_node(self.size)) < 1 else SPIN_TESTS)
        self.mpi = MPIHandles(MPI, self.comm, self.side, self._host_view, self._machine_key,
                              self._split_by_color, MPI.COMM_WORLD.Get_rank(), self.spin_tests)

    # -- where the ranks live (minidist.comm.topology) ---------------------------------------
    def _machine_key(self) -> int:
        """``COMM_WORLD`` rank of the lowest rank sharing my memory (``MPI_Comm_split_type``).

        Collective over this transport's communicator (waited with its deadline first).
        """
        MPI = self.MPI
        req = self.comm.Ibarrier()
        _wait_local(req, self.timeout_s, f"[rank {self.rank}/{self.size}] topology")
        node = self.comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        try:
            leader = MPI.Group.Translate_ranks(node.Get_group(), [0], MPI.COMM_WORLD.Get_group())
        finally:
            node.Free()
        return int(leader[0])

    def _split_by_color(self, color: int, key: int) -> "MPITransport":
        """``MPI_Comm_split`` of this transport's communicator (after an Ibarrier with the
        deadline): an MPITransport over the ranks with the same ``color``."""
        req = self.comm.Ibarrier()
        _wait_local(req, self.timeout_s, f"[rank {self.rank}/{self.size}] split")
        sub = self.comm.Split(color, key)
        try:
            return MPITransport(sub, self.timeout_s)
        finally:
            sub.Free()  # MPITransport made its own duplicates

    # -- GPU buffers -------------------------------------------------------------------------
    def cuda_aware(self) -> bool:
        """Whether device buffers go to MPI directly (decided once, logged once)."""
        if self._cuda_aware_now is None:
            forced = env("MINIDIST_CUDA_AWARE_MPI")
            probed = mpi_cuda_aware() if forced is None else None
            self._cuda_aware_now = bool(forced) if forced is not None else probed is True
            if self.rank == 0:
                log.info("GPU buffers: %s (MINIDIST_CUDA_AWARE_MPI=%s, probe=%s)",
                         "passed to MPI directly" if self._cuda_aware_now
                         else "staged through host",
                         raw("MINIDIST_CUDA_AWARE_MPI") or "auto", probed)
        return self._cuda_aware_now

    def _host_view(self, buf: Any, for_recv: bool) -> tuple:
        """(array MPI sees, callback after completion or None) for a numpy or cupy buffer."""
        if not backend.is_device_array(buf):
            return buf, None
        backend.synchronize(buf)
        if self.cuda_aware():
            return buf, None
        host = backend.to_host(buf)
        if not for_recv:
            return host, None

        def copy_back() -> None:
            buf.set(host) if hasattr(buf, "set") else buf.__setitem__(Ellipsis, host)
        return host, copy_back

    # -- point to point ----------------------------------------------------------------------
    def isend(self, buf: Any, dst: int, tag: int = 0) -> Request:
        view, _ = self._host_view(buf, for_recv=False)
        self._count_sent(dst, view.nbytes)
        req = self.comm.Isend([view, self.MPI.BYTE], dst, tag)
        return _MPIRequest(self, req, "send", dst, view.nbytes, keep=view, tag=tag)

    def irecv(self, buf: Any, src: int, tag: int = 0) -> Request:
        view, after = self._host_view(buf, for_recv=True)
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

    # -- side channel ------------------------------------------------------------------------
    def split(self, members: list[int], timeout_s: float) -> Transport | None:
        """A transport over an ``MPI_Comm_split`` of this one (collective over every rank)."""
        color = 0 if self.rank in members else self.MPI.UNDEFINED
        key = members.index(self.rank) if self.rank in members else 0
        sub = self.comm.Split(color, key)
        return None if self.rank not in members else MPITransport(sub, timeout_s)

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
