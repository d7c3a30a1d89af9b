"""Shared memory between the ranks of one node: MPI-3 shared windows and a flag barrier.

    node = shm_node(mpi_transport)              # collective on first use; cached per transport
    node.barrier()                              # every rank of the node arrived (names laggards)
    buf = shm_alloc_buffer(mpi_transport, numel, np.float32)   # collective: a shared bucket

A window gives every rank a slot of its own and maps every peer's slot into this process::

    process of rank 1:   slots[0] ──► rank 0's memory ┐
                         slots[1] ──► my memory       ├ one MPI_Win_allocate_shared
                         slots[2] ──► rank 2's memory ┘   (plain loads/stores, no messages)

Synchronization is a *flag barrier* in a small control window instead of ``MPI_Barrier``: rank
r writes an increasing counter to its own cache line and waits until every peer's counter
caught up. It is several times faster than ``MPI_Barrier`` (docs/benchmarks.md), also with
more ranks than cores, because a waiting rank gives its core away with ``sched_yield`` (not
``time.sleep(0)``, which sleeps a scheduler tick). Each rank writes only its own flag, so no
atomics are needed; ``MPI_Win_sync`` before the flag store and after the wait orders the data
stores and loads around it (a no-op on x86, a fence elsewhere). The wait has a deadline and
names the ranks that did not arrive.

MPI's own set-up calls here are blocking collectives (``Split_type``, ``Win_allocate_shared``,
``Win_free``), so each is preceded by an ``Ibarrier`` with the transport's deadline: they only
start once every rank has arrived, and a rank that never comes is a CommTimeout, not a hang.

Per-rank control window layout::

    line 0: the barrier flag    line 1: the guard, 4 x (call number, fingerprint)
    lines 2-3: two header rows of the shm all-reduce (fastpath/shm.py)
    then two mailboxes (calls alternate): a line (numel, dtype, op) + SMALL_BYTES of data
                                          (the small all-reduce, fastpath/shm_mailbox.py)

The guard line (call numbers and fingerprints of MPI's Allreduce and of the mailbox
all-reduce) has its own module: fastpath/shm_guard.py.
"""

from __future__ import annotations

import os
import platform
import time
import weakref
from typing import Any

import numpy as np

from minidist.comm.env import cores_per_rank
from minidist.comm.errors import CommError, CommTimeout
from minidist.comm.transports.base import (DEFAULT_TIMEOUT_S, LINE_BYTES, Transport, from_line,
                                          wait_until)
from minidist.envvars import env
from minidist.fastpath.shm_guard import GuardLine

LINE = LINE_BYTES        # bytes: one cache line per flag (pollers never share a writer's line)
HEADER_INTS = 8          # per-rank int64 header words beside the flag (see algorithms/shm.py)
SPINS_BEFORE_YIELD = 2000  # busy polls before sched_yield; 0 when ranks outnumber cores
SMALL_BYTES = int(env("MINIDIST_SHM_SMALL_BYTES"))  # default 32 KiB: a mailbox's data
MAILBOX = LINE + -(-SMALL_BYTES // LINE) * LINE      # one mailbox: its line, its data
# Stores reach other cores in program order on x86; elsewhere a fence (MPI_Win_sync) orders a
# mailbox's data before the call number that publishes it (shm_guard.py).
WEAK_ORDER = platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686")


class SharedWindow:
    """One ``MPI_Win_allocate_shared`` window: ``nbytes`` per rank, every slot mapped locally.

    Args:
        node_comm: an mpi4py communicator whose ranks all share memory (``COMM_TYPE_SHARED``).
        nbytes: bytes in this rank's slot (all ranks pass the same value).
    """

    def __init__(self, node_comm: Any, nbytes: int, arrive: Any = None) -> None:
        from mpi4py import MPI

        self.nbytes = int(nbytes)
        self.arrive = arrive  # every rank reached this point (Ibarrier with a deadline)
        if arrive is not None:
            arrive("shared window allocation")
        # a line more than asked: every slot starts on a cache line (MPI places them end to
        # end, and an odd size would leave the next rank's mid-line; a shared segment is
        # mapped at a page boundary in every process, so every rank finds the same start)
        self.win = MPI.Win.Allocate_shared(max(self.nbytes, LINE) + LINE, 1, comm=node_comm)
        self.win.Lock_all(MPI.MODE_NOCHECK)  # passive epoch for the window's lifetime (Sync)
        self.slots = [from_line(np.frombuffer(self.win.Shared_query(j)[0], np.uint8), self.nbytes)
                      for j in range(node_comm.Get_size())]
        self.base = [s.ctypes.data for s in self.slots]

    def find(self, rank: int, arr: np.ndarray) -> int | None:
        """Byte offset of ``arr`` inside ``rank``'s slot, or None when it lies elsewhere."""
        off = arr.ctypes.data - self.base[rank]
        return off if 0 <= off and off + arr.nbytes <= self.nbytes else None

    def free(self) -> None:
        """Release the window (collective over the node communicator)."""
        if self.win is not None:
            self.slots, self.base = [], []
            self.win.Unlock_all()
            if self.arrive is not None:
                self.arrive("shared window release")
            self.win.Free()
            self.win = None


class ShmNode:
    """Per-transport shared-memory state: node communicator, control window, user windows.

    Raises:
        CommError: when the transport has no MPI communicator or the ranks span several nodes.
    """

    def __init__(self, transport: Transport, timeout_s: float | None = None) -> None:
        comm = transport.mpi.comm if transport.mpi is not None else None
        prefix = f"[rank {transport.rank}/{transport.size}]"
        if comm is None:
            raise CommError(
                f"{prefix} all_reduce(algorithm=\"shm\"): the shared-memory path needs the MPI "
                f"transport (an MPI-3 shared window), got the {transport.name!r} transport. Use "
                f"backend='mpi' under mpiexec, or algorithm='ring'/'auto'.")
        from mpi4py import MPI

        self.prefix = prefix
        if timeout_s is None:
            timeout_s = transport.timeout_s or DEFAULT_TIMEOUT_S
        self.timeout_s = float(timeout_s)
        # The side communicator and (weakly) the transport, whose poll hook the waits here run:
        # this object is cached per transport in a weak dictionary, so it must not keep it alive.
        self.side = transport.mpi.side
        self._transport = weakref.ref(transport)
        self.arrive("shared-memory set-up")
        self.comm = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        if self.size != comm.Get_size():
            sizes = self.size
            self.comm.Free()
            raise CommError(
                f"{prefix} all_reduce(algorithm=\"shm\"): the ranks span several nodes (this "
                f"node holds {sizes} of {comm.Get_size()} ranks); shared memory reaches only one "
                f"node. Use algorithm='ring' or 'auto'.")
        self.spins = 0 if cores_per_rank(self.size) < 1 else SPINS_BEFORE_YIELD
        # Per rank: a flag line, then two header rows used alternately by successive calls, so
        # a fast rank writing the next call's header never overwrites one a slow rank still reads.
        boxes = 2 * LINE + 2 * HEADER_INTS * 8  # where the mailboxes start
        self.control = SharedWindow(self.comm, boxes + 2 * MAILBOX, self.arrive)
        self.flags = [s[:8].view(np.int64) for s in self.control.slots]
        # the guard line of MPI's Allreduce and the mailbox all-reduce (shm_guard.py)
        self.guard = GuardLine([memoryview(s[LINE:2 * LINE]).cast("q") for s in
                                self.control.slots], self.rank, prefix, self.spins,
                               self.timeout_s, self._poll,
                               self.control.win.Sync if WEAK_ORDER else None)
        # mailboxes[half][rank]: that rank's mailbox for the calls with ``k & 1 == half``
        self.mailboxes = [[s[boxes + h * MAILBOX: boxes + (h + 1) * MAILBOX]
                           for s in self.control.slots] for h in (0, 1)]
        self.headers = [s[2 * LINE: 2 * LINE + 2 * HEADER_INTS * 8].view(np.int64)
                        .reshape(2, HEADER_INTS) for s in self.control.slots]
        self.calls = 0  # collectives started on this node (same count on every rank)
        self.half = 0   # which half of a double-buffered scratch window the next chunk uses
        self.seq = int(self.flags[self.rank][0])
        self.user_windows: list[SharedWindow] = []  # alloc / release keep ``owners`` in step
        # ids of the arrays that own my slots of ``user_windows``: what ``arr.base`` is for any
        # view of a ``shm_alloc_buffer`` array (NumPy collapses view chains); the windows hold
        # those arrays, so the ids stay unique while listed. One set, changed in place: the
        # planner holds it (``shared_bases``) to ask, with no call, whether a buffer is shared
        self.owners: set[int] = set()
        self.extra: dict[str, Any] = {}  # per-algorithm persistent state (scratch windows)

    def arrive(self, what: str) -> None:
        """Every rank of the transport reached ``what`` (``Ibarrier``, deadline, failure watch).

        Without a side communicator (a transport other than MPITransport) it returns at once.
        """
        if self.side is None:
            return
        req = self.side.Ibarrier()

        def timed_out() -> CommTimeout:
            return CommTimeout(f"{self.prefix} {what}: not every rank arrived within "
                               f"{self.timeout_s:g} s. Some rank is in another collective, "
                               "stuck or dead.")
        wait_until(req.Test, self.timeout_s, timed_out, self._poll)

    def _poll(self) -> Exception | None:
        t = self._transport()
        hook = None if t is None else t.poll_hook
        return None if hook is None else hook(None, 0)

    def owns(self, flat: Any) -> bool:
        """True when ``flat`` (a NumPy array) views one of this rank's shared windows."""
        return id(flat.base) in self.owners

    def barrier(self, what: str = "shm barrier") -> None:
        """Wait until every rank of the node reached its matching ``barrier`` call."""
        self.control.win.Sync()
        self.seq += 1
        seq = self.seq
        self.flags[self.rank][0] = seq
        deadline = None
        for flag in self.flags:
            k = 0
            while flag[0] < seq:
                k += 1
                if k > self.spins:
                    os.sched_yield()
                    if k % 1024 == 0:
                        deadline = deadline or time.monotonic() + self.timeout_s
                        error = self._poll()  # e.g. a peer reported a failure
                        if error is not None and flag[0] < seq:
                            raise error
                        if time.monotonic() > deadline:
                            late = [i for i, f in enumerate(self.flags) if f[0] < seq]
                            raise CommTimeout(
                                f"{self.prefix} {what}: ranks {late} did not arrive within "
                                f"{self.timeout_s:g}s. They are slow, stuck in another "
                                f"collective, or dead; raise MINIDIST_TIMEOUT_S if only slow.")
        self.control.win.Sync()

    def alloc(self, nbytes: int) -> SharedWindow:
        """A new shared window of ``nbytes`` per rank (collective), kept until ``free``."""
        w = SharedWindow(self.comm, nbytes, self.arrive)
        self.user_windows.append(w)
        self.owners.add(id(w.slots[self.rank].base))
        return w

    def release(self, w: SharedWindow) -> None:
        """Free ``w``, a window of ``alloc`` (collective), and forget it; nothing to do when
        ``free`` released every window first (``shm_close`` before ``destroy_process_group``)."""
        if w not in self.user_windows:
            return
        self.user_windows.remove(w)
        self.owners.discard(id(w.slots[self.rank].base))
        w.free()

    def free(self) -> None:
        """Release every window and the node communicator (collective)."""
        owned = [v for v in self.extra.values() if callable(getattr(v, "free", None))]
        for w in self.user_windows + owned + [self.control]:
            w.free()
        self.user_windows, self.extra = [], {}
        self.owners.clear()
        self.comm.Free()


_NODES: "weakref.WeakKeyDictionary[Transport, ShmNode]" = weakref.WeakKeyDictionary()


shm_owns = ShmNode.owns  # shm_owns(node, flat): the same question as a function


def window_of(node: ShmNode, flat: np.ndarray) -> tuple[int, int]:
    """(window index, byte offset) of ``flat`` in this rank's shared buffers, or (-1, -1)
    (the shared-memory all-reduce's zero-copy path needs the same place on every rank)."""
    if id(flat.base) not in node.owners:
        return -1, -1  # private memory: no address lookup (``ctypes.data`` is slow) needed
    for i, w in enumerate(node.user_windows):
        off = w.find(node.rank, flat)
        if off is not None:
            return i, off
    return -1, -1


def shm_node(transport: Transport) -> ShmNode:
    """The transport's ShmNode, created (collectively) on first use."""
    node = _NODES.get(transport)
    if node is None:
        node = _NODES[transport] = ShmNode(transport)
        if transport.mpi is not None:  # MPI's Allreduce guards fingerprints through it
            transport.mpi.guard_node = node
    return node


def shm_alloc_buffer(transport: Transport, numel: int, dtype: Any) -> np.ndarray:
    """Allocate a 1-D array in shared memory (collective: every rank, same numel and dtype).

    ``all_reduce(algorithm="shm")`` on such an array (or a slice of it at the same offset on
    every rank) reads peers' data in place: no copy into the window first.

    Args:
        transport: an MPI transport whose ranks are all on this node.
        numel: number of elements.
        dtype: NumPy dtype.

    Returns:
        A NumPy array of ``numel`` elements backed by this rank's slot (not zeroed).
    """
    dt = np.dtype(dtype)
    w = shm_node(transport).alloc(int(numel) * dt.itemsize)
    return w.slots[transport.rank][: int(numel) * dt.itemsize].view(dt)


def shm_free_buffer(transport: Transport, buf: np.ndarray) -> bool:
    """Free the window of a ``shm_alloc_buffer`` array (collective: every rank, same buffer).

    Its memory is unmapped: drop every array that views it first (touching one afterwards
    crashes the process). Returns False, doing nothing, if ``buf`` is not in such a window.
    """
    node = _NODES.get(transport)
    if node is None or not isinstance(buf, np.ndarray):
        return False
    for w in node.user_windows:
        if w.find(node.rank, buf) is not None:
            node.release(w)
            return True
    return False


def shm_close(transport: Transport) -> None:
    """Free the transport's shared windows (collective); call before closing the transport."""
    node = _NODES.pop(transport, None)
    if node is not None:
        if transport.mpi is not None and transport.mpi.guard_node is node:
            transport.mpi.guard_node = None
        node.free()
