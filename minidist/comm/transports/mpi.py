"""The MPI transport: point-to-point byte messages through mpi4py, plus MPI's own Allreduce.

    t = MPITransport()                  # dups COMM_WORLD, so user MPI traffic never collides
    t.sendrecv(a, right, b, left)       # Isend/Irecv([buf, MPI.BYTE]) on the raw bytes
    t.native_all_reduce(buf, ReduceOp.SUM)   # MPI_Allreduce(IN_PLACE): the baseline ("mpi")

Design notes:
- Buffers go to MPI as raw bytes (``[buf, MPI.BYTE]``), never as pickled objects; the receiver
  checks the byte count it got, so a shape mismatch between ranks is a CommError, not garbage.
- Every wait is bounded: it spins on ``Test()`` a few hundred times (the fast path, a few
  microseconds; only twice when ranks outnumber cores), then keeps testing with
  ``os.sched_yield()`` between tests (releases the GIL and the core; ``time.sleep(0)`` costs
  ~55 us here) until ``timeout_s``, then raises CommTimeout naming rank, op, peer.
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
import time
from typing import Any

from minidist import xp as backend
from minidist.comm.errors import CommError, CommTimeout
from minidist.comm.ops import ReduceOp, finalize, parse_op
from minidist.comm.transports.base import DEFAULT_TIMEOUT_S, Request, Transport
from minidist.log import get_logger

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
    v = (value or "auto").strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    if v == "auto":
        return None
    raise ValueError(f"MINIDIST_CUDA_AWARE_MPI={value!r} is not understood; use 'auto' (probe the "
                     "MPI library), '1' (pass GPU buffers to MPI) or '0' (stage through host).")


def mpi_cuda_aware() -> bool | None:
    """Ask the loaded MPI library whether it can take CUDA device pointers (after MPI init).

    Returns True/False when the library answers (MPI 4.1 ``mpi_memory_alloc_kinds`` info key, or
    Open MPI's / MPICH's ``MPIX_Query_cuda_support``), None when it cannot tell. The PyPI MPI
    wheels answer False. See docs/env_vars.md and /work/shared/gpu-notes.md section 3.
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

    __slots__ = ("t", "req", "op", "peer", "nbytes", "status", "after", "keep")

    def __init__(self, t: "MPITransport", req: Any, op: str, peer: int, nbytes: int,
                 status: Any = None, after: Any = None, keep: Any = None) -> None:
        self.t, self.req, self.op, self.peer, self.nbytes = t, req, op, peer, nbytes
        self.status, self.after, self.keep = status, after, keep

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
        deadline = time.monotonic() + timeout_s
        while not self._test():
            if time.monotonic() > deadline:
                raise CommTimeout(
                    f"[rank {self.t.rank}/{self.t.size}] {self.op}(peer={self.peer}, "
                    f"{self.nbytes} bytes): not complete after {timeout_s:.1f} s. Rank {self.peer} "
                    "is late, stuck or dead; check every rank calls the same collectives in the "
                    "same order (raise MINIDIST_TIMEOUT_S for slow steps).")
            os.sched_yield()


_MPI_OPS = {ReduceOp.SUM: "SUM", ReduceOp.AVG: "SUM", ReduceOp.MAX: "MAX", ReduceOp.MIN: "MIN",
            ReduceOp.PROD: "PROD"}


class MPITransport(Transport):
    """Point-to-point over a duplicate of ``MPI.COMM_WORLD`` (or of the communicator given)."""

    name = "mpi"

    def __init__(self, comm: Any = None, timeout_s: float | None = None) -> None:
        self.MPI = load_mpi()
        self.comm = (comm or self.MPI.COMM_WORLD).Dup()
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.timeout_s = DEFAULT_TIMEOUT_S if timeout_s is None else float(timeout_s)
        self._cuda_aware: bool | None = None  # decided on the first device buffer
        self.spin_tests = (OVERSUBSCRIBED_SPIN_TESTS if self.size > (os.cpu_count() or 1)
                           else SPIN_TESTS)

    # -- GPU buffers -------------------------------------------------------------------------
    def cuda_aware(self) -> bool:
        """Whether device buffers go to MPI directly (decided once, logged once)."""
        if self._cuda_aware is None:
            forced = parse_cuda_aware_env(os.environ.get("MINIDIST_CUDA_AWARE_MPI"))
            probed = mpi_cuda_aware() if forced is None else None
            self._cuda_aware = bool(forced) if forced is not None else probed is True
            if self.rank == 0:
                log.info("GPU buffers: %s (MINIDIST_CUDA_AWARE_MPI=%s, probe=%s)",
                         "passed to MPI directly" if self._cuda_aware else "staged through host",
                         os.environ.get("MINIDIST_CUDA_AWARE_MPI", "auto"), probed)
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
        req = self.comm.Isend([view, self.MPI.BYTE], dst, tag)
        return _MPIRequest(self, req, "send", dst, view.nbytes, keep=view)

    def irecv(self, buf: Any, src: int, tag: int = 0) -> Request:
        view, after = self._host_view(buf, for_recv=True)
        req = self.comm.Irecv([view, self.MPI.BYTE], src, tag)
        return _MPIRequest(self, req, "recv", src, view.nbytes, status=self.MPI.Status(),
                           after=after, keep=view)

    def sendrecv(self, sendbuf: Any, dst: int, recvbuf: Any, src: int, tag: int = 0,
                 timeout_s: float | None = None) -> None:
        if backend.is_device_array(sendbuf) or backend.is_device_array(recvbuf):
            return super().sendrecv(sendbuf, dst, recvbuf, src, tag, timeout_s)
        # Host fast path (the ring's inner loop): raw requests, one Status, no wrapper objects
        # unless the spin phase runs out.
        byte = self.MPI.BYTE
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
            _MPIRequest(self, sreq, "send", dst, sendbuf.nbytes).wait(timeout_s)
        if not rdone:
            _MPIRequest(self, rreq, "recv", src, recvbuf.nbytes, status=status).wait(timeout_s)
        elif status.Get_count(byte) != recvbuf.nbytes:
            _MPIRequest(self, None, "recv", src, recvbuf.nbytes, status=status)._complete()

    # -- MPI's own collective (the baseline) -------------------------------------------------
    def native_all_reduce(self, buf: Any, op: str | ReduceOp = ReduceOp.SUM) -> None:
        """``MPI_Allreduce(MPI_IN_PLACE, buf)``: MPI's own algorithm; AVG = SUM then divide.

        A blocking MPI call: it has no minidist deadline (it is the baseline being measured).
        """
        op = parse_op(op)
        view, after = self._host_view(buf, for_recv=True)
        self.comm.Allreduce(self.MPI.IN_PLACE, view, op=getattr(self.MPI, _MPI_OPS[op]))
        if after is not None:
            after()
        finalize(buf, op, self.size)

    def abort(self, code: int = 1) -> None:
        """End the whole job now (every rank), e.g. after an uncaught exception on this rank."""
        self.MPI.COMM_WORLD.Abort(code)

    def close(self) -> None:
        if self.comm is not None and not self.MPI.Is_finalized():
            self.comm.Free()
        self.comm = None
