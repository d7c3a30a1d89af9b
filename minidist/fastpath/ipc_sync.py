"""How the ranks of a CUDA-IPC all-reduce order their phases: flags, and one header check.

    control = host_control(transport)            # collective; None where no memory is shared
    agree = RowAgreement(control, transport) if control else MessageAgreement(transport)
    agree.check([numel, dtype, op, fingerprint], call)       # host: a few microseconds
    signals.signal(IN, call)                     # queued: "my copy-in of this call is done"
    signals.wait(peer, IN, call)                 # queued: later work waits for the peer's

**Flags.** Every rank owns three counters, one per phase (``IN``: my copy-in is done, ``RED``:
my slice is reduced, ``OUT``: my copy-out is done), each in a cache line of its own, readable
by every peer. A phase ``signal`` stores the call number after the work queued before it; a
``wait`` holds the work queued after it until the peer's counter reaches the call number. The
counters only grow, so a wait never needs to know how far ahead a peer is. Three kinds:

    StreamSignals   flags in device memory, stored and awaited by the GPU itself
                    (cuStreamWriteValue32 / cuStreamWaitValue32 on the caller's stream):
                    the host only enqueues, it never waits (ipc_device.py)
    HostSignals     flags in host memory every rank maps (an MPI shared window, or one
                    process's arrays for thread ranks); the host stores and spins (deadline,
                    names the rank). With ``before=stream sync`` it orders a GPU from the host;
                    on host windows it IS the stream: the CPU twin of StreamSignals
    MessageSignals  no shared memory (TCP): sync, then one host barrier per phase

**Agreement.** Before anything is queued, every rank compares its call header (numel, dtype,
op, fingerprint) with the peers': ``RowAgreement`` writes it into one of two rows of its host
control line (call parity; a peer can be at most one call ahead, so the row it reads is never
overwritten under it) and reads the peers' rows: a spin of a few microseconds when the ranks
are in step. ``MessageAgreement`` all-gathers the header (transports without shared memory).
A mismatch raises CollectiveMismatch on every rank before any device work is queued.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any, Callable, Protocol

import numpy as np

from minidist.comm.algorithms.ring import ring_all_gather
from minidist.comm.errors import CollectiveMismatch, CommTimeout
from minidist.comm.transports.base import DEFAULT_TIMEOUT_S, Transport, poller, wait_until

IN, RED, OUT = 0, 1, 2
"""Flag indices: my copy-in is done, my slice is reduced, my copy-out is done."""
FLAGS = 3
LINE = 64
HEADER_WORDS = 8          # per row: 7 header words, then the call number that makes it valid
CONTROL_BYTES = 2 * HEADER_WORDS * 8 + FLAGS * LINE   # two header rows, three flag lines
SPINS = 200               # polls before a wait starts yielding the core


class Signals(Protocol):
    """Phase flags on one rank's stream (see the module docstring)."""

    def signal(self, flag: int, value: int) -> None:
        """Queue: my ``flag`` := ``value``, after everything queued before it."""

    def wait(self, rank: int, flag: int, value: int) -> None:
        """Queue: what is queued after this waits until ``rank``'s ``flag`` >= ``value``."""


class Agreement(Protocol):
    def check(self, header: list[int], call: int) -> None:
        """Raise CollectiveMismatch unless every rank passed this ``header`` for ``call``."""


class HostControl:
    """Every rank's host control line mapped here: two header rows and three flags each.

    Args:
        lines: one uint8 array of ``CONTROL_BYTES`` per rank (rank order), mapped here.
        rank: this rank.
        release: frees the memory (collective for an MPI shared window), or None.
    """

    def __init__(self, lines: list[np.ndarray], rank: int, release: Any = None) -> None:
        self.rows = [m[:2 * HEADER_WORDS * 8].view(np.int64).reshape(2, HEADER_WORDS)
                     for m in lines]
        base = 2 * HEADER_WORDS * 8
        self.flags = [m[base:base + FLAGS * LINE].view(np.uint32)[::LINE // 4] for m in lines]
        self.rank, self._release = rank, release
        lines[rank][...] = 0  # before any peer reads it: the creator barriers after this

    def close(self) -> None:
        self.rows, self.flags = [], []
        if self._release is not None:
            self._release()
            self._release = None


_LOCAL: dict[int, np.ndarray] = {}  # handle -> control line: thread ranks of one process
_NEXT = itertools.count(1)
_LOCK = threading.Lock()


def exchange_local(transport: Transport, memory: np.ndarray, tag: int = 0) -> list[np.ndarray]:
    """Every rank's ``memory`` (ranks that are threads of this process), in rank order: each
    registers its array under a number and the ranks all-gather the numbers, as processes
    all-gather CUDA IPC handles. Collective."""
    with _LOCK:
        handle = next(_NEXT)
        _LOCAL[handle] = memory
    handles = np.zeros(transport.size, np.int64)
    handles[transport.rank] = handle
    ring_all_gather(transport, handles, tag)
    peers = [_LOCAL[int(h)] for h in handles]
    ring_all_gather(transport, np.zeros(transport.size, np.int64), tag)  # all have looked up
    with _LOCK:
        _LOCAL.pop(handle, None)
    return peers


def host_control(transport: Transport, tag: int = 0) -> HostControl | None:
    """The control lines of ``transport``'s ranks in shared host memory (collective), or None
    when the ranks share none (TCP between processes)."""
    if transport.one_process:
        lines = exchange_local(transport, np.zeros(CONTROL_BYTES, np.uint8), tag)
        control = HostControl(lines, transport.rank)
    elif transport.mpi is not None:
        from minidist.fastpath.shm_window import shm_node

        node = shm_node(transport)
        window = node.alloc(CONTROL_BYTES)

        def release() -> None:
            node.release(window)
        control = HostControl([s[:CONTROL_BYTES] for s in window.slots], transport.rank, release)
    else:
        return None
    ring_all_gather(transport, np.zeros(transport.size, np.int64), tag)  # every line is zeroed
    return control


def _late(transport: Transport, what: str, ranks: list[int], timeout_s: float) -> CommTimeout:
    return CommTimeout(f"[rank {transport.rank}/{transport.size}] all_reduce(algorithm="
                       f"\"cuda_ipc\"): {what}: ranks {ranks} did not arrive within "
                       f"{timeout_s:g} s. They are slow, stuck in another collective, or dead; "
                       "raise MINIDIST_TIMEOUT_S if only slow.")


def _spin(test: Callable[[], bool], transport: Transport, what: str, late: Callable[[], list],
          timeout_s: float) -> None:
    for _ in range(SPINS):
        if test():
            return
    wait_until(test, timeout_s, lambda: _late(transport, what, late(), timeout_s),
               poller(transport, None, 0))


class RowAgreement:
    """``Agreement`` through the header rows of a ``HostControl`` (module docstring)."""

    def __init__(self, control: HostControl, transport: Transport) -> None:
        self.control, self.transport = control, transport
        self.timeout_s = transport.timeout_s or DEFAULT_TIMEOUT_S

    def check(self, header: list[int], call: int) -> None:
        rows, me, r = self.control.rows, self.control.rank, call & 1
        mine = rows[me][r]
        mine[:len(header)] = header
        mine[HEADER_WORDS - 1] = call  # last: makes the row valid (x86 keeps store order)
        k, last = len(header), HEADER_WORDS - 1
        for j, row in enumerate(rows):
            if j == me:
                continue
            peer = row[r]
            if peer[last] != call:
                _spin(_equals(peer, last, call), self.transport,
                      f"header check of call {call}",
                      lambda: [i for i, x in enumerate(rows) if x[r][last] != call],
                      self.timeout_s)
            if not np.array_equal(peer[:k], mine[:k]):
                raise mismatch(self.transport, j, peer[:k].tolist(), header)


def _equals(row: np.ndarray, i: int, value: int) -> Callable[[], bool]:
    return lambda: bool(row[i] == value)


class MessageAgreement:
    """``Agreement`` by an all-gather of the headers over the transport (no shared memory)."""

    def __init__(self, transport: Transport, tag: int = 0) -> None:
        self.transport, self.tag = transport, tag

    def check(self, header: list[int], call: int) -> None:
        rows = all_gather_header(self.transport, [*header, call], self.tag)
        for j, other in enumerate(rows):
            if other != rows[self.transport.rank]:
                raise mismatch(self.transport, j, other[:-1], header)


def meet(transport: Transport, tag: int = 0) -> None:
    """A host barrier over the transport (set-up and teardown, not per call)."""
    all_gather_header(transport, [1], tag)


def all_gather_header(transport: Transport, header: list[int], tag: int) -> list[list[int]]:
    """A host barrier that also all-gathers every rank's header (a few int64s)."""
    k = len(header)
    rows = np.zeros(transport.size * k, np.int64)
    rows[transport.rank * k:(transport.rank + 1) * k] = header
    ring_all_gather(transport, rows, tag)
    return rows.reshape(transport.size, k).tolist()


def mismatch(transport: Transport, j: int, other: list[int], mine: list[int]
             ) -> CollectiveMismatch:
    return CollectiveMismatch(
        f"[rank {transport.rank}/{transport.size}] all_reduce(algorithm=\"cuda_ipc\"): rank {j} "
        f"passed (numel, dtype, op, fingerprint) = {other} but rank {transport.rank} passed "
        f"{list(mine)}. Every rank must pass the same shape, dtype and op.")


class HostSignals:
    """``Signals`` on host flags, stored and awaited by the host as they are queued.

    Made with each set of windows (collectively, before the ranks meet at the windows'
    creation): it zeroes this rank's flags.

    Args:
        control: the ranks' host control lines (flags).
        transport: for deadlines, the failure poll and error messages.
        before: called before each store (``stream.synchronize`` orders a GPU's work before
            the flag); None on host windows, where the host itself is the stream.
    """

    def __init__(self, control: HostControl, transport: Transport,
                 before: Callable[[], None] | None = None) -> None:
        self.flags, self.rank = control.flags, control.rank
        self.transport, self.before = transport, before
        self.timeout_s = transport.timeout_s or DEFAULT_TIMEOUT_S
        self.stores = 0  # flag stores so far (tests count them)
        # New windows count their calls from 1 again: my flags restart at 0. The creator
        # meets the peers after this (no peer waits on the old counts any more by then).
        self.flags[self.rank][:] = 0

    def signal(self, flag: int, value: int) -> None:
        if self.before is not None:
            self.before()
        self.flags[self.rank][flag] = value
        self.stores += 1

    def wait(self, rank: int, flag: int, value: int) -> None:
        f = self.flags[rank]
        if f[flag] < value:
            _spin(lambda: bool(f[flag] >= value), self.transport,
                  f"flag {('IN', 'RED', 'OUT')[flag]} = {value}", lambda: [rank],
                  self.timeout_s)


class MessageSignals:
    """``Signals`` without shared memory: a signal syncs the stream, the first wait on a
    (flag, value) is one host barrier over the transport. ``OUT`` waits are free: every rank
    synced its stream before the next call's ``IN`` barrier, so nothing reads an old half."""

    def __init__(self, transport: Transport, sync: Callable[[], None], tag: int = 0) -> None:
        self.transport, self.sync, self.tag = transport, sync, tag
        self._met: tuple[int, int] | None = None

    def signal(self, flag: int, value: int) -> None:
        self.sync()

    def wait(self, rank: int, flag: int, value: int) -> None:
        if flag == OUT or self._met == (flag, value):
            return
        all_gather_header(self.transport, [flag, value], self.tag)
        self._met = (flag, value)


__all__ = ["IN", "RED", "OUT", "FLAGS", "CONTROL_BYTES", "Signals", "Agreement", "HostControl",
           "host_control", "exchange_local", "RowAgreement", "MessageAgreement", "HostSignals",
           "MessageSignals", "all_gather_header", "meet", "mismatch"]
