"""The MPI transport: point-to-point byte messages through mpi4py, plus MPI's own Allreduce.

    t = MPITransport()                  # dups COMM_WORLD, so user MPI traffic never collides
    t.sendrecv(a, right, b, left)       # Isend/Irecv([buf, MPI.BYTE]) on the raw bytes
    t.native_all_reduce(buf, ReduceOp.SUM)   # MPI_Iallreduce(IN_PLACE): the baseline ("mpi")

Design notes:
- Buffers go to MPI as raw bytes (``[buf, MPI.BYTE]``), never as pickled objects; the receiver
  checks the byte count it got, so a shape mismatch between ranks is a CommError, not garbage.
- Every wait is bounded: it spins on ``Test()`` a few hundred times (the fast path, a few
  microseconds; only twice when ranks outnumber cores), then keeps testing with
  ``os.sched_yield()`` between tests (releases the GIL and the core; ``time.sleep(0)`` costs
  ~55 us here) until ``timeout_s``, then raises CommTimeout naming rank, op, peer. MPI's own
  collectives are waited the same way (``Iallreduce``, ``Ibarrier``, ``Idup``): no call blocks
  without a deadline. In the slow phase a wait runs the ``poll_hook`` every ``POLL_S``
  (base.py), which reads the side channel: a second duplicate of the communicator (``side``)
  that only failure notices and farewells use, so it is never blocked behind a stuck call.
- MPI's Allreduce cannot carry a tag, so the fingerprint of the call (``tag`` from the process
  group) is guarded beside it: on one node each rank writes ``(call number, fingerprint)`` into
  its line of the shared control window before posting, and compares the peers' lines after
  (or while) waiting, a few loads and stores; across nodes a 2-word ``Iallreduce(MAX)`` of
  ``[fp, -fp]`` runs alongside the data. A difference is ``CollectiveMismatch`` on every rank,
  never a silently wrong sum (MPICH itself sums mismatched dtypes and even counts silently).
- mpi4py is imported lazily: ``import minidist`` works on a machine without libmpi; only asking
  for MPI raises, with what to install.
- GPU buffers (CuPy): the current stream is synchronized before MPI sees the buffer (MPI cannot
  know about queued kernels). They are staged through a host copy unless the MPI library is
  CUDA-aware: ``MINIDIST_CUDA_AWARE_MPI=1`` forces the direct path, ``0`` forces staging, and
  ``auto`` (default) asks ``mpi_cuda_aware()``. A wrong "yes" is a segfault, so unknown -> stage.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

import numpy as np

from minidist import xp as backend
from minidist.comm.errors import CollectiveMismatch, CommError, CommTimeout
from minidist.comm.ops import ReduceOp, finalize, parse_op
from minidist.comm.transports.base import (DEFAULT_TIMEOUT_S, MAX_STREAMS, Request, Transport,
                                           stream_of, wait_until)
from minidist.log import get_logger
from minidist.envvars import env, raw

log = get_logger(__name__)

SPIN_TESTS = 200  # Test() calls before the first yield: keeps small messages fast
# More ranks than cores (e.g. 4 ranks on this 2-core VM): a spinning rank holds the core its peer
# needs, so spin only briefly and give the core away with sched_yield (~1 us; time.sleep(0)
# costs ~55 us here). Ring at n=4, 8 B: 963 us -> 377 us (docs/benchmarks.md).
OVERSUBSCRIBED_SPIN_TESTS = 2


def load_mpi() -> Any:
    """Import ``mpi4py.MPI`` (initializing MPI) or raise a CommError that says what to install."""
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise CommError(f"backend='mpi' needs mpi4py, which is not importable ({e}). Install it "
                        "with `pip install mpi4py mpich`, or use backend='tcp' or 'local'.") from e
    except RuntimeError as e:  # mpi4py: "cannot load MPI library"
        raise CommError(f"mpi4py is installed but found no MPI library ({e}). Install one "
                        "(`pip install mpich`, or your system's MPI and set MPI4PY_LIBMPI), or use "
                        "backend='tcp' or 'local'.") from e
    return MPI


def parse_cuda_aware_env(value: str | None) -> bool | None:
    """Parse ``MINIDIST_CUDA_AWARE_MPI``: ``1``/``true`` -> True, ``0``/``false`` -> False,
    unset/``auto`` -> None (probe).

    Raises:
        ValueError: for any other value, naming the variable and the accepted values.
    """
    value_: bool | None = env("MINIDIST_CUDA_AWARE_MPI", {"MINIDIST_CUDA_AWARE_MPI": value or ""})
    return value_


def mpi_cuda_aware() -> bool | None:
    """Ask the loaded MPI library whether it can take CUDA device pointers (after MPI init).

    Returns True/False when the library answers (MPI 4.1 ``mpi_memory_alloc_kinds`` info key, or
    Open MPI's / MPICH's ``MPIX_Query_cuda_support``), None when it cannot tell. The PyPI MPI
    wheels answer False. See docs/env_vars.md (MINIDIST_CUDA_AWARE_MPI).
    """
    MPI = load_mpi()
    try:
        info = MPI.COMM_WORLD.Get_info()
        kinds = info.get("mpi_memory_alloc_kinds")
        info.Free()
        if kinds and "cuda:device" in kinds.split(","):
            return True
    except Exception:  # noqa: BLE001 - older MPIs have no such key; fall through to MPIX
        pass
    # mpi4py dlopens libmpi RTLD_LOCAL, so CDLL(None) cannot see it: reopen by name, no load.
    for so in ("libmpi.so.40", "libmpi.so.12", "libmpi_abi.so.1", "libmpi.so"):
        try:
            lib = ctypes.CDLL(so, mode=os.RTLD_NOLOAD | os.RTLD_GLOBAL)
        except OSError:
            continue
        f = getattr(lib, "MPIX_Query_cuda_support", None)
        if f is not None:
            f.restype = ctypes.c_int
            return bool(f())
    return None


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
                raise CommError(
                    f"[rank {self.t.rank}/{self.t.size}] recv(src={self.peer}): got {got} bytes "
                    f"but expected {self.nbytes}. Every rank must pass arrays of the same shape "
                    "and dtype to a collective.")
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
        wait_until(self.test, timeout_s, timed_out, self.t.poller(self.peer, self.tag))


_STREAM_MASK = MAX_STREAMS - 1
_MPI_OPS = {ReduceOp.SUM: "SUM", ReduceOp.AVG: "SUM", ReduceOp.MAX: "MAX", ReduceOp.MIN: "MIN",
            ReduceOp.PROD: "PROD"}


def _wait_local(req: Any, timeout_s: float, what: str) -> None:
    """Wait for an MPI request with a deadline but no side channel (it does not exist yet)."""
    def timed_out() -> CommTimeout:
        return CommTimeout(f"{what}: not every rank of the MPI job arrived within {timeout_s:g} "
                           "s. Start every rank with the same program, or raise "
                           "MINIDIST_TIMEOUT_S.")
    wait_until(req.Test, timeout_s, timed_out)


class MPITransport(Transport):
    """Point-to-point over a duplicate of ``MPI.COMM_WORLD`` (or of the communicator given)."""

    name = "mpi"
    abort_ends_job = True  # MPI_Abort ends every rank
    has_native_all_reduce = True

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
        self.guard_node: Any = None  # the ShmNode when every rank shares one node (shm_window)
        self._guard = np.zeros(2, np.int64)  # across nodes: [fp, -fp] reduced with MAX
        self._in_place = MPI.IN_PLACE
        self._mpi_ops = [None] + [getattr(MPI, _MPI_OPS[op]) for op in ReduceOp]  # by op.code
        self._side_sends: list = []  # (request, buffer) of side messages in flight
        self._cuda_aware: bool | None = None  # decided on the first device buffer
        self.spin_tests = (OVERSUBSCRIBED_SPIN_TESTS if self.size > (os.cpu_count() or 1)
                           else SPIN_TESTS)

    # -- where the ranks live (minidist.comm.topology) ---------------------------------------
    @property
    def world_rank(self) -> int:
        return self.MPI.COMM_WORLD.Get_rank()

    def machine_key(self) -> int:
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

    def split_by_color(self, color: int, key: int) -> "MPITransport":
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
        if self._cuda_aware is None:
            forced = env("MINIDIST_CUDA_AWARE_MPI")
            probed = mpi_cuda_aware() if forced is None else None
            self._cuda_aware = bool(forced) if forced is not None else probed is True
            if self.rank == 0:
                log.info("GPU buffers: %s (MINIDIST_CUDA_AWARE_MPI=%s, probe=%s)",
                         "passed to MPI directly" if self._cuda_aware else "staged through host",
                         raw("MINIDIST_CUDA_AWARE_MPI") or "auto", probed)
        return self._cuda_aware

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
        self.count_sent(dst, view.nbytes)
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
        self.count_sent(dst, sendbuf.nbytes)
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
            _MPIRequest(self, None, "recv", src, recvbuf.nbytes, status=status)._complete()

    # -- MPI's own collective (the baseline) -------------------------------------------------
    def native_all_reduce(self, buf: Any, op: str | ReduceOp = ReduceOp.SUM, tag: int = 0,
                          timeout_s: float | None = None) -> None:
        """``MPI_Iallreduce(MPI_IN_PLACE, buf)`` waited with a deadline; AVG = SUM then divide.

        ``tag``: the process group's message tag of this call; when it carries a fingerprint
        (``has_fingerprint``), the ranks check they all passed the same one (module docstring).
        Same as ``native_wait(native_post(buf, op, tag), timeout_s)``.

        Raises:
            CollectiveMismatch: a rank passed a different fingerprint (another collective, or
                another count, dtype or op); raised on every rank that sees it.
            CommTimeout: not complete within ``timeout_s``; a poll-hook error (a peer gave up).
        """
        self.native_wait(self.native_post(buf, op, tag), timeout_s)

    def native_post(self, buf: Any, op: str | ReduceOp = ReduceOp.SUM, tag: int = 0) -> tuple:
        """Publish the fingerprint guard and post the ``Iallreduce``; returns what
        ``native_wait`` needs. Nothing else may run on this communicator in between."""
        if type(op) is not ReduceOp:
            op = parse_op(op)
        view, after = (buf, None) if type(buf) is np.ndarray else self._host_view(buf, True)
        node, k, greq = self.guard_node, 0, None
        if tag > _STREAM_MASK:  # has_fingerprint(tag), inlined: this is the 8-byte hot path
            if node is not None:  # publish (k, fp) in my guard line (shm_window.py)
                node.ncoll = k = node.ncoll + 1
                mine, i = node.my_guard, (k & 3) << 1
                mine[i + 1] = tag
                mine[i] = k
            else:
                self._guard[0], self._guard[1] = tag, -tag
                greq = self.comm.Iallreduce(self._in_place, self._guard, op=self.MPI.MAX)
        req = self.comm.Iallreduce(self._in_place, view, op=self._mpi_ops[op.code])
        # MPICH advances a non-blocking collective only inside MPI calls (no progress thread):
        # one Test() now sends this rank's data, so the caller's work until native_wait
        # overlaps the transfer instead of delaying it.
        done = req.Test()
        return req, greq, buf, view, after, op, node, k, tag, done

    def native_wait(self, pending: tuple, timeout_s: float | None = None) -> None:
        """Finish a ``native_post``: wait with the deadline, check the guard, finalize AVG."""
        req, greq, buf, view, after, op, node, k, tag, done = pending
        try:
            if not done:
                for _ in range(self.spin_tests):
                    if req.Test():
                        break
                else:
                    self._wait_native(req, view.nbytes, timeout_s, node, k, tag)
            if greq is not None:
                self._wait_native(greq, 16, timeout_s, None, 0, tag)
        except self.MPI.Exception as e:
            self._check_guard(node, k, tag, complete=True)
            raise CommError(f"[rank {self.rank}/{self.size}] all_reduce(algorithm=\"mpi\", "
                            f"{view.nbytes} bytes): MPI error {e}. Every rank must pass the same "
                            "shape and dtype.") from e
        if k:
            i = (k & 3) << 1
            for g in node.peer_guards:  # node.guard_mismatch(k, tag, True), inlined
                if g[i] != k or g[i + 1] != tag:
                    self._check_guard(node, k, tag, complete=True)
        elif greq is not None and (self._guard[0] != tag or self._guard[1] != -tag):
            raise CollectiveMismatch(
                f"[rank {self.rank}/{self.size}] all_reduce(algorithm=\"mpi\"): another rank "
                "called a different collective here (its call fingerprint differs).")
        if after is not None:
            after()
        if op is ReduceOp.AVG:
            finalize(buf, op, self.size)

    def _wait_native(self, req: Any, nbytes: int, timeout_s: float | None, node: Any, k: int,
                     tag: int) -> None:
        timeout_s = self.timeout_s if timeout_s is None else timeout_s

        def timed_out() -> CommTimeout:
            return CommTimeout(
                f"[rank {self.rank}/{self.size}] all_reduce(algorithm=\"mpi\", {nbytes} bytes): "
                f"not complete after {timeout_s:.1f} s. Some rank did not join this MPI "
                "Allreduce; check every rank calls the same collectives in the same order (raise "
                "MINIDIST_TIMEOUT_S for slow steps).")

        hook = self.poll_hook

        def poll() -> Exception | None:
            if k:  # a peer that posted this call number with another fingerprint: fail now
                try:
                    self._check_guard(node, k, tag, complete=False)
                except CollectiveMismatch as e:
                    return e
            return None if hook is None else hook(None, tag)
        wait_until(req.Test, timeout_s, timed_out, poll)

    def _check_guard(self, node: Any, k: int, tag: int, complete: bool) -> None:
        if not k:
            return
        bad = node.guard_mismatch(k, tag, complete)
        if bad:
            raise CollectiveMismatch(
                f"[rank {self.rank}/{self.size}] all_reduce(algorithm=\"mpi\"): rank"
                f"{'s' if len(bad) > 1 else ''} {', '.join(map(str, bad))} called a different "
                "collective as this MPI call (its call fingerprint differs).")

    # -- side channel ------------------------------------------------------------------------
    def side_send(self, dst: int, kind: int, payload: bytes) -> None:
        if self.side is None or dst == self.rank:
            return
        buf = np.frombuffer(bytes(payload), np.uint8)
        self._side_sends = [(r, b) for r, b in self._side_sends if not r.Test()]
        self._side_sends.append((self.side.Isend([buf, self.MPI.BYTE], dst, kind), buf))

    def side_try_recv(self, src: int, kind: int) -> bytes | None:
        if self.side is None:
            return None
        status = self.MPI.Status()
        msg = self.side.Improbe(src, kind, status)
        if msg is None:
            return None
        buf = np.empty(status.Get_count(self.MPI.BYTE), np.uint8)
        req = msg.Irecv([buf, self.MPI.BYTE])

        def timed_out() -> CommTimeout:
            return CommTimeout(f"[rank {self.rank}/{self.size}] side channel: a message from "
                               f"rank {src} did not complete.")
        wait_until(req.Test, min(self.timeout_s, 5.0), timed_out)
        return buf.tobytes()

    def side_pending(self, kind: int) -> int | None:
        if self.side is not None and self.side.Iprobe(self.MPI.ANY_SOURCE, kind, self._status):
            return self._status.Get_source()
        return None

    def stray_tag(self, src: int, tag: int) -> int | None:
        if self.comm is not None and self.comm.Iprobe(src, self.MPI.ANY_TAG, self._status):
            other = self._status.Get_tag()
            if other != tag and stream_of(other) == stream_of(tag):
                return other
        return None

    def mpi_comm(self) -> Any | None:
        return self.comm

    def shared_memory_comm(self) -> Any | None:
        return self.comm

    def side_comm(self) -> Any | None:
        return self.side

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
        """
        self.MPI.COMM_WORLD.Abort(code)
        os._exit(code)

    def close(self) -> None:
        if not self.MPI.Is_finalized():
            for c in (self.comm, self.side):
                if c is not None:
                    c.Free()
        self.comm = self.side = None
