"""The collective ledger: every rank's record of the collectives it called, and their fingerprints.

    group = md.init_process_group()
    md.all_reduce(x)                                 # recorded as collective #1 of stream 0
    with md.comm.ledger_label("bucket=3"):           # a caller's label on the next entries
        md.all_reduce(grad_bucket)                   # (or all_reduce(..., label="bucket=3"))
    for e in md.comm.get_ledger()[-3:]:              # LedgerEntry objects, oldest first
        print(e.seq, e.describe(), e.status, e.where)

Each process group keeps one ``Ledger``, on by default, an observer of its collectives
(comm/calls.py: the group calls ``start``/``end``/``failed`` around each one): a ring buffer of the
last ``capacity`` calls (``MINIDIST_LEDGER_SIZE``, default 512). An entry holds the call number on
its stream
(``seq``, from 1), the collective, the reduce op, the algorithm and why it was chosen (auto's
rule), count, dtype, shape, root (src/dst), a caller's label, the caller's file:line (the first
frame outside minidist from the one the call's ``stacklevel`` names, found by walking
``sys._getframe``: a wrapper passes 2 and is not walked through; for DDP's communication thread,
whose stack never leaves minidist, the outermost minidist frame), start/end times, and the
status (``CallStatus``). An entry is the ``Call`` itself (comm/calls.py), which carries the
call number and the message tag.

Fingerprints: each call has a 64-bit fingerprint of (seq, collective, op, dtype, count, root,
algorithm), folded into its message tags (comm/calls.py), so calls that differ across ranks
never consume each other's messages; MPI's own Allreduce and the shared-memory algorithm compare
it explicitly (mpi_native.py, shm.py). The tags do not depend on the ledger. What the
fingerprints catch, and what they cannot (the ledger's diff then names the calls)::

    rank 0                       rank 1                       result
    all_reduce(1024 x f32, sum)  all_reduce(1024 x i32, sum)  CollectiveMismatch (MPI, shm: at
                                                              once; p2p algorithms: timeout)
    all_reduce(..., sum)         all_reduce(..., max)         CollectiveMismatch
    all_reduce(...)              broadcast(..., src=0)        both time out; the ledger diff
                                                              names both calls
    skips all_reduce #1 (line 57)  #1 at line 57, #2 at 61    #1 pairs with #1 (same
                                                              arguments, nothing to tell them
                                                              apart); #2 times out, and the
                                                              diff points at the line numbers

On a failure the ranks exchange their recent entries (failure/exchange.py) and the error names
the first call where they differ. ``MINIDIST_LEDGER=0`` turns the ledger off (no entries, no
exchange: a failure raises as it was found; the fingerprints stay in the tags);
``MINIDIST_LEDGER_DUMP=dir`` writes each rank's ledger as JSON on a failure and at
``destroy_process_group``.

Cost (every collective, 8-byte all-reduces included): a short frame walk to the caller and an
append to a bounded deque (the group's ``Calls`` times every call); see docs/benchmarks.md.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import enum
import json
import os
import sys
import threading
import time
from collections import deque
from pathlib import Path
from time import perf_counter
from typing import Any, Iterator

import numpy as np

from minidist.comm.calls import Call, CollectiveObserver
from minidist.comm.errors import CommTimeout
from minidist.envvars import env

DEFAULT_CAPACITY = 512
_M64 = (1 << 64) - 1


def ledger_enabled() -> bool:
    """``MINIDIST_LEDGER`` (default on): ``0`` turns the ledger off (the fingerprints in the
    message tags stay: comm/calls.py)."""
    return bool(env("MINIDIST_LEDGER"))


def ledger_capacity() -> int:
    """``MINIDIST_LEDGER_SIZE``: entries kept per process group (default 512, at least 16)."""
    return int(env("MINIDIST_LEDGER_SIZE"))


class CallStatus(enum.Enum):
    """Lifecycle of one ledger entry: RUNNING -> OK, or RUNNING -> FAILED / TIMEOUT."""

    RUNNING = "running"
    OK = "ok"
    FAILED = "failed"
    TIMEOUT = "timeout"


_RUNNING = CallStatus.RUNNING


# -- labels and call sites -------------------------------------------------------------------
_LABEL: contextvars.ContextVar[str | None] = contextvars.ContextVar("minidist_label",
                                                                     default=None)
# ledger_label blocks open in any thread: while none is, ``start`` does not read _LABEL
_LABELS_OPEN = 0
_LABELS_LOCK = threading.Lock()


@contextlib.contextmanager
def ledger_label(text: str) -> Iterator[None]:
    """Label every collective called inside the block (this thread/context) in the ledger.

        with minidist.comm.ledger_label("bucket=3"):
            comm.all_reduce(bucket.buffer)      # ledger entry .label == "bucket=3"

    Nested labels join with ``/`` ("step=7/bucket=3"). DDP-style callers use it around a
    bucket's reduction; an explicit ``label=`` argument of ``all_reduce`` wins over it.
    """
    global _LABELS_OPEN
    outer = _LABEL.get()
    token = _LABEL.set(text if outer is None else f"{outer}/{text}")
    with _LABELS_LOCK:
        _LABELS_OPEN += 1
    try:
        yield
    finally:
        with _LABELS_LOCK:
            _LABELS_OPEN -= 1
        _LABEL.reset(token)


_PACKAGE_DIR = str(Path(os.path.abspath(__file__)).parents[2]) + os.sep  # minidist/
# Frames that are not the caller: minidist's own, and contextlib's (``group.observed``).
_INSIDE = (_PACKAGE_DIR, contextlib.__file__)
_THREADING_FILE = threading.__file__
# The files met in the walk, by side: after the first call from a file the walk runs no
# Python call at all (a set lookup per frame). Keyed by file name, whose hash a str keeps:
# a code object's hash is worked out anew each time, from all of its code (0.7 us for a
# training loop's function).
_OURS: set[str] = set()
_THEIRS: set[str] = set()


def inside(filename: str) -> bool:
    """True for a file of minidist (or contextlib), remembering the answer per file name."""
    ours = filename.startswith(_INSIDE)
    (_OURS if ours else _THEIRS).add(filename)
    return ours


def line_of(code: Any, lasti: int) -> int:
    """The source line of byte offset ``lasti`` in ``code`` (what ``frame.f_lineno`` computes,
    done only when an entry is read: it costs more than the whole frame walk)."""
    line = code.co_firstlineno
    for start, end, ln in code.co_lines():
        if ln is not None:
            line = ln
        if start <= lasti < end:
            break
    return line


# -- entries ---------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class LedgerEntry:
    """One recorded collective (a read-only view of a ledger row).

    Attributes:
        seq: call number on its stream, from 1 (the same on every rank for the same call).
        stream: the ``tag`` the caller passed (0 by default).
        collective: "all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter",
            "barrier", "broadcast_object", "all_gather_object", "alloc_buffer" (a shared-memory
            buffer: collective too).
        op: reduce op ("sum", ...) or None.
        algorithm: the algorithm that ran ("ring", "mpi", ... ; "tree" for broadcast).
        reason: why: "explicit", or auto's rule / model numbers.
        count, dtype, shape: the array (count 0, dtype None for ``*_object`` and barrier).
        root: src of broadcast*, dst of reduce, else None.
        label: the caller's label (``ledger_label`` / ``label=``), or None.
        file, line: the caller's source location.
        start_s, end_s: ``time.time()`` at start and end (end None while running).
        status: "running", "ok", "failed" or "timeout".
        error: first line of the error of a failed call, or None.
    """

    seq: int
    stream: int
    collective: str
    op: str | None
    algorithm: str | None
    reason: str | None
    count: int
    dtype: str | None
    shape: tuple | None
    root: int | None
    label: str | None
    file: str
    line: int
    start_s: float
    end_s: float | None
    status: str
    error: str | None = None

    @property
    def where(self) -> str:
        """``train.py:57``: the caller's file name (no directory) and line."""
        return f"{os.path.basename(self.file)}:{self.line}"

    def describe(self) -> str:
        """``all_reduce(1024 x float32, sum)``, ``broadcast(12 x float64, src=0)``, ..."""
        return describe(self.to_dict())

    def to_dict(self) -> dict:
        """A JSON-able dict of every field."""
        d = dataclasses.asdict(self)
        d["shape"] = list(self.shape) if self.shape is not None else None
        return d


def describe(e: dict) -> str:
    """The call of an entry dict in words, as error messages show it."""
    parts = []
    if e["dtype"] is not None:
        parts.append(f"{e['count']} x {e['dtype']}")
    if e["op"] is not None:
        parts.append(e["op"])
    if e["root"] is not None:
        parts.append(f"{'dst' if e['collective'] == 'reduce' else 'src'}={e['root']}")
    if e.get("label"):
        parts.append(e["label"])
    return f"{e['collective']}({', '.join(parts)})"


class Ledger(CollectiveObserver):
    """The ring buffer of one process group's collectives (see the module docstring); an
    observer of the group's calls (``Calls.add``), which time them.

    Args:
        rank, size: of the group (for dumps).
        capacity: entries kept (oldest dropped first).
        enabled: False: the group does not register it (``MINIDIST_LEDGER=0``), so it records
            nothing and the failure diagnosis does not run.
        calls: the group's ``Calls`` (comm/calls.py), whose call numbers ``counts`` reports.
    """

    def __init__(self, rank: int, size: int, capacity: int = DEFAULT_CAPACITY,
                 enabled: bool = True, calls: Any = None) -> None:
        self.rank, self.size, self.capacity, self.enabled = rank, size, int(capacity), enabled
        self._rows: deque = deque(maxlen=self.capacity)  # Call objects; the oldest drop out
        self._calls = calls  # the group's Calls: the call numbers per stream
        # perf_counter for cheap, precise times; wall clock = _wall0 + (t - _perf0)
        self._perf0, self._wall0 = perf_counter(), time.time()
        self.failures = 0

    # -- the observer ----------------------------------------------------------------------
    def start(self, call: Call) -> None:
        """Keep ``call`` as the newest entry, with its caller's site and its label.

        The site is the first frame outside minidist from the collective's caller outwards, or
        the outermost minidist frame when the stack has none (DDP's communication thread starts
        in ``threading``: its stack never leaves minidist); its line is worked out only when
        the entry is read (``line_of``).
        """
        # frame 1 is Calls.begin, 2 the collective: start at the caller its ``stacklevel``
        # names (3 for 1: the collective's caller; 4 past a wrapper that passed 2), or the
        # collective when begin ran at a top level. ``sys._getframe`` builds no frame object
        # for the frames it passes (``f_back`` from them would: a new one every call).
        try:
            f = sys._getframe(2 + call.stacklevel)
        except ValueError:  # (past the outermost frame)
            f = sys._getframe(2)
        # a frame of minidist (or contextlib): known by its file, or seen the first time
        while (((file := f.f_code.co_filename) in _OURS or file not in _THEIRS and inside(file))
               and (back := f.f_back) is not None and back.f_code.co_filename != _THREADING_FILE):
            f = back
        call.site = (f.f_code, f.f_lasti)
        if _LABELS_OPEN and call.label is None:  # a ledger_label block is open somewhere
            call.label = _LABEL.get()
        self._rows.append(call)

    def failed(self, call: Call, error: BaseException) -> None:
        """Mark a call failed (TIMEOUT for a deadline) and keep the first line of the error.
        (A call that returned needs nothing: its end time says OK.)"""
        call.status = CallStatus.TIMEOUT if isinstance(error, CommTimeout) else CallStatus.FAILED
        call.error = str(error).split("\n", 1)[0]
        self.failures += 1

    def counts(self) -> dict[int, int]:
        """``{stream: calls so far}`` on the group (``calls``), or of the entries kept."""
        if self._calls is not None:
            return self._calls.counts()
        out: dict[int, int] = {}
        for r in list(self._rows):
            out[r.stream] = max(out.get(r.stream, 0), r.seq)
        return out

    # -- reading -----------------------------------------------------------------------------
    def _ordered_rows(self) -> list:
        return sorted(self._rows, key=lambda r: r.t0)  # (two threads on two streams may race)

    @staticmethod
    def status(call: Call) -> CallStatus:
        """An entry's status: set on failure; otherwise RUNNING until it has an end time."""
        st = call.status
        return st if st is not None else (_RUNNING if call.t1 is None else CallStatus.OK)

    def _as_dict(self, r: Call) -> dict:
        wall = self._wall0 - self._perf0
        spec, (code, lasti) = r.spec, r.site
        op, dt, root = spec.op, spec.dtype, spec.root
        failed = r.status is not None
        return {"seq": r.seq, "stream": r.stream, "collective": spec.collective,
                "op": op.value if op is not None else None, "algorithm": spec.algorithm,
                "reason": spec.reason, "count": int(spec.numel),
                "dtype": None if dt is None else np.dtype(dt).name,
                "shape": None if r.shape is None else [int(x) for x in r.shape],
                "root": None if root < 0 else int(root), "label": r.label,
                "file": code.co_filename, "line": line_of(code, lasti),
                "start_s": wall + r.t0, "end_s": None if r.t1 is None else wall + r.t1,
                "status": self.status(r).value, "error": r.error if failed else None}

    def records(self, stream: int | None = None, last: int | None = None) -> list[dict]:
        """Entries as JSON-able dicts, oldest first (optionally one stream, the last N)."""
        rows = [r for r in self._ordered_rows() if stream is None or r.stream == stream]
        if last is not None:
            rows = rows[-last:]
        return [self._as_dict(r) for r in rows]

    def entries(self, stream: int | None = None, last: int | None = None) -> list[LedgerEntry]:
        """Entries as ``LedgerEntry`` objects, oldest first."""
        out = []
        for d in self.records(stream, last):
            d = dict(d)
            d["shape"] = tuple(d["shape"]) if d["shape"] is not None else None
            out.append(LedgerEntry(**d))
        return out

    def to_json(self, extra: dict | None = None) -> dict:
        """The whole ledger as one JSON-able dict (what ``dump`` writes)."""
        return {"rank": self.rank, "world_size": self.size, "pid": os.getpid(),
                "enabled": self.enabled, "capacity": self.capacity, "counts": {
                    str(k): v for k, v in self.counts().items()},
                "entries": self.records(), **(extra or {})}

    def dump(self, directory: str | os.PathLike, extra: dict | None = None) -> Path:
        """Write ``<directory>/ledger_rank<r>.json`` (temp file, then rename); return the path."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"ledger_rank{self.rank}.json"
        tmp = path.with_suffix(f".json.tmp{os.getpid()}")
        tmp.write_text(json.dumps(self.to_json(extra), indent=1))
        os.replace(tmp, path)
        return path


def dump_dir() -> str | None:
    """``MINIDIST_LEDGER_DUMP``: where ledgers are written (on failure, at destroy), or None."""
    return os.environ.get("MINIDIST_LEDGER_DUMP") or None
