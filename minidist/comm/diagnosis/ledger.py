"""The collective ledger: every rank's record of the collectives it called, and their fingerprints.

    group = md.init_process_group()
    md.all_reduce(x)                                 # recorded as collective #1 of stream 0
    with md.comm.ledger_label("bucket=3"):           # a caller's label on the next entries
        md.all_reduce(grad_bucket)                   # (or all_reduce(..., label="bucket=3"))
    for e in md.comm.get_ledger()[-3:]:              # LedgerEntry objects, oldest first
        print(e.seq, e.describe(), e.status, e.where)

Each process group keeps one ``Ledger``, always on: a ring buffer of the last ``capacity``
calls (``MINIDIST_LEDGER_SIZE``, default 512). An entry holds the call number on its stream
(``seq``, from 1), the collective, the reduce op, the algorithm and why it was chosen (auto's
rule), count, dtype, shape, root (src/dst), a caller's label, the caller's file:line (the first
frame outside minidist, found by walking ``sys._getframe``; for DDP's communication thread,
whose stack never leaves minidist, the outermost minidist frame), start/end times, and the
status (``CallStatus``).

Fingerprints: each call has a 64-bit ``fingerprint(seq, collective, op, dtype, count, root,
algorithm)``. The process group folds it into the message tags of the call (transports/base.py
``wire_tag``), so calls that differ across ranks never consume each other's messages; MPI's own
Allreduce and the shared-memory algorithm compare it explicitly (transports/mpi.py, shm.py).
What it catches and what it cannot::

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

On a failure the ranks exchange their recent entries (``comm/failure.py``) and the error names
the first call where they differ. ``MINIDIST_LEDGER=0`` turns ledger and fingerprints off (the
cost comparison in docs/benchmarks.md); ``MINIDIST_LEDGER_DUMP=dir`` writes each rank's ledger
as JSON on a failure and at ``destroy_process_group``.

Cost (the hot path of every collective, 8-byte all-reduces included): a few attribute stores
into a preallocated list, two ``perf_counter`` calls and a short frame walk; see
docs/benchmarks.md for the measured overhead. ``all_reduce`` calls ``claim`` (call number and
message tag, from a memoized signature) before its first message and ``record`` (the row,
its site recognised by the identity of the caller's memoized plan) after posting it, so on
MPI's non-blocking Allreduce the row is written while the data moves.
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
import zlib
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from minidist.comm.ops import SUPPORTED_DTYPES, ReduceOp
from minidist.comm.transports.base import STREAM_BITS, fingerprint_mask
from minidist.envvars import env

DEFAULT_CAPACITY = 512
_M64 = (1 << 64) - 1


def ledger_enabled() -> bool:
    """``MINIDIST_LEDGER`` (default on): ``0`` turns the ledger and the fingerprints off."""
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


# -- fingerprints ----------------------------------------------------------------------------
# Small stable codes (the same in every process: Python's str hash is salted per process, int
# and tuple-of-int hashes are not).
COLLECTIVES = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "barrier",
               "broadcast_object", "all_gather_object", "consistency_check", "alloc_buffer")
_COLLECTIVE_CODE = {name: i + 1 for i, name in enumerate(COLLECTIVES)}
_DTYPE_CODE: dict = {None: 0, **{np.dtype(d): i + 1 for i, d in enumerate(SUPPORTED_DTYPES)}}
_ALGO_CODE: dict = {None: 0}


def _algo_code(name: str | None) -> int:
    code = _ALGO_CODE.get(name)
    if code is None:
        code = _ALGO_CODE[name] = zlib.crc32(str(name).encode()) & 0xFFFFFF or 1
    return code


def fingerprint(seq: int, collective: str, op: ReduceOp | None, dtype: Any, count: int,
                root: int, algorithm: str | None) -> int:
    """A 64-bit digest of one call; equal on every rank exactly when the calls agree.

    Mixes the call number ``seq`` (so the n-th call of one rank only matches the n-th of
    another), the collective, reduce op, dtype, element count, root (-1 for none) and the
    resolved algorithm: Python's hash of tuples of small integers, which is the same in every
    process of one Python version (ranks run the same interpreter). ``Ledger.begin`` computes
    the same value (the signature part once per call site).
    """
    return hash((seq, signature(collective, op, dtype, count, root, algorithm)))


def signature(collective: str, op: ReduceOp | None, dtype: Any, count: int, root: int,
              algorithm: str | None) -> int:
    """The part of a call's fingerprint that does not change from call to call (no ``seq``).

    ``fingerprint(seq, ...) == hash((seq, signature(...)))``; a caller that makes the same call
    again and again (a training loop's all-reduce) computes it once and passes it to
    ``Ledger.claim``.
    """
    return hash((count, root, _COLLECTIVE_CODE[collective], 0 if op is None else op.code,
                 _DTYPE_CODE.get(dtype, 15), _ALGO_CODE.get(algorithm) or _algo_code(algorithm)))


def call_plan(collective: str, count: int, dtype: Any, op: ReduceOp | None, root: int,
              algorithm: str | None, reason: str | None) -> tuple:
    """What ``Ledger.claim`` and ``Ledger.record`` need of a call that repeats: ``(signature,
    collective, count, dtype, op, root, algorithm, reason)``; make it once, pass it each time."""
    return (signature(collective, op, dtype, count, root, algorithm), collective, count, dtype,
            op, root, algorithm, reason)


# -- labels and call sites -------------------------------------------------------------------
_LABEL: contextvars.ContextVar[str | None] = contextvars.ContextVar("minidist_label",
                                                                     default=None)


@contextlib.contextmanager
def ledger_label(text: str) -> Iterator[None]:
    """Label every collective called inside the block (this thread/context) in the ledger.

        with minidist.comm.ledger_label("bucket=3"):
            comm.all_reduce(bucket.buffer)      # ledger entry .label == "bucket=3"

    Nested labels join with ``/`` ("step=7/bucket=3"). DDP-style callers use it around a
    bucket's reduction; an explicit ``label=`` argument of ``all_reduce`` wins over it.
    """
    outer = _LABEL.get()
    token = _LABEL.set(text if outer is None else f"{outer}/{text}")
    try:
        yield
    finally:
        _LABEL.reset(token)


_PACKAGE_DIR = str(Path(os.path.abspath(__file__)).parents[2]) + os.sep  # minidist/
_THREADING_FILE = threading.__file__
_internal: dict[str, bool] = {}


def _inside(filename: str) -> bool:
    inside = _internal.get(filename)
    if inside is None:
        inside = _internal[filename] = filename.startswith(_PACKAGE_DIR)
    return inside


def _walk_out(f: Any) -> tuple[Any, int]:
    """``(code, lasti)`` of the first frame at or above ``f`` outside minidist (see caller_site)."""
    last, known = f, _internal
    while f is not None:
        code = f.f_code
        inside = known.get(code.co_filename)  # a dict hit for every frame after the first call
        if inside is None:
            inside = _inside(code.co_filename)
        if not inside:
            if code.co_filename == _THREADING_FILE:
                break
            return code, f.f_lasti
        last, f = f, f.f_back
    return last.f_code, last.f_lasti


def line_of(code: Any, lasti: int) -> int:
    """The source line of byte offset ``lasti`` in ``code`` (what ``frame.f_lineno`` computes,
    done only when an entry is read: ``f_lineno`` costs ~0.6 us per call in the hot path)."""
    line = code.co_firstlineno
    for start, end, ln in code.co_lines():
        if ln is not None:
            line = ln
        if start <= lasti < end:
            break
    return line


def caller_site(depth: int = 2) -> tuple[str, int]:
    """``(filename, line)`` of the first frame outside the minidist package.

    ``depth`` skips the frames of this function and its caller. When the whole stack is
    minidist's (DDP's communication thread starts in ``threading``), the outermost minidist
    frame is returned instead.
    """
    code, lasti = _walk_out(sys._getframe(depth))
    return code.co_filename, line_of(code, lasti)


# -- entries ---------------------------------------------------------------------------------
# A row of the ring buffer (a plain list: the cheapest thing to build in the hot path). What
# repeats from call to call lives in a shared "site" tuple: one per caller location (code
# object and byte offset of the first frame outside minidist) and call signature, cached, so
# a training loop's repeated call only builds the small row and hashes (seq, site signature).
SEQ, TAG, T0, T1, SITE, LABEL, STATUS, ERROR = range(8)  # TAG: the call's message tag
# site tuple: the call's static part
(S_STREAM, S_COLLECTIVE, S_OP, S_ALGORITHM, S_REASON, S_COUNT, S_DTYPE, S_SHAPE, S_ROOT, S_CODE,
 S_LASTI, S_SIG, S_PLAN) = range(13)  # S_PLAN: see Ledger.record
_SITES_MAX = 4096  # cached sites (a new signature at a known location replaces the old one)


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


class Ledger:
    """The ring buffer of one process group's collectives (see the module docstring).

    Args:
        rank, size: of the group (for dumps).
        capacity: entries kept (oldest dropped first).
        enabled: False records nothing and fingerprints nothing (``MINIDIST_LEDGER=0``).
        max_tag: the transport's largest message tag (the fingerprint is folded below it).
    """

    def __init__(self, rank: int, size: int, capacity: int = DEFAULT_CAPACITY,
                 enabled: bool = True, max_tag: int = (1 << 62) - 1) -> None:
        self.rank, self.size, self.capacity, self.enabled = rank, size, int(capacity), enabled
        self._fp_mask = fingerprint_mask(int(max_tag))  # see transports.base.wire_tag
        self._rows: list = [None] * self.capacity
        self._n = 0  # rows written (two threads on two streams may rarely overwrite one row)
        self._seq: dict[int, int] = {}   # stream -> calls so far
        self._sites: dict[tuple, tuple] = {}  # (id(code), lasti, stream, collective) -> site
        self._plan_sites: dict[tuple, tuple] = {}  # record's: (id(code), lasti, stream) -> site
        # perf_counter for cheap, precise times; wall clock = _wall0 + (t - _perf0)
        self._perf0, self._wall0 = time.perf_counter(), time.time()
        self.failures = 0

    def begin(self, collective: str, stream: int, count: int, dtype: Any, shape: Any,
              op: ReduceOp | None, root: int, algorithm: str | None, reason: str | None,
              label: str | None = None) -> list:
        """Record the start of a call; return its row (a list). ``row[TAG]`` is the call's
        message tag: ``wire_tag(stream, fingerprint(...), max_tag)``, computed inline.

        The hot path (every collective): find the caller (a short frame walk), look its site up
        (same location and signature as last time: reuse it), build an 8-slot row. No
        formatting, no line-number lookup (``records`` does that when an entry is read).
        """
        seqs = self._seq
        seq = seqs.get(stream, 0) + 1
        seqs[stream] = seq
        try:
            f = sys._getframe(2)  # the collective's caller (frame 1 is the collective itself)
        except ValueError:  # called from the top of a stack
            f = sys._getframe(1)
        code = f.f_code
        if _internal.get(code.co_filename, True):  # minidist's own, or not classified yet
            code, lasti = _walk_out(f)
        else:
            lasti = f.f_lasti
        key = (id(code), lasti, stream, collective)
        site = self._sites.get(key)
        if (site is None or site[S_COUNT] != count or site[S_DTYPE] is not dtype
                or site[S_OP] is not op or site[S_ALGORITHM] != algorithm
                or site[S_REASON] is not reason or site[S_SHAPE] != shape
                or site[S_ROOT] != root):
            site = self._new_site(key, collective, stream, count, dtype, shape, op, root,
                                  algorithm, reason, code, lasti)
        i = self._n
        self._n = i + 1
        self._rows[i % self.capacity] = row = [
            seq, stream | ((hash((seq, site[S_SIG])) & self._fp_mask) or 1) << STREAM_BITS,
            time.perf_counter(), None, site, label or _LABEL.get(), None, None]
        return row

    def claim(self, stream: int, sig: int) -> tuple[int, int]:
        """``(seq, message tag)`` of the next call on ``stream``, whose ``signature`` is ``sig``.

        The first half of ``begin``, split off for the all-reduce fast path: the tag (call
        number and fingerprint) must exist before the first message is posted, while the row
        (``record``) can be written while the message is in flight. Every ``claim`` must be
        followed by a ``record`` of the same call (even when posting it fails), or the call
        numbers and the recorded rows no longer pair up.
        """
        seqs = self._seq
        seq = seqs.get(stream, 0) + 1
        seqs[stream] = seq
        return seq, stream | ((hash((seq, sig)) & self._fp_mask) or 1) << STREAM_BITS

    def record(self, seq: int, tag: int, t0: float, stream: int, shape: Any,
               label: str | None, plan: tuple, depth: int = 2) -> list:
        """The second half of ``begin``: write the row of a ``claim``ed call started at ``t0``
        (``time.perf_counter()``); return it. The caller's site is ``depth`` frames up (2:
        called directly by the collective, as ``begin`` is).

        ``plan``: ``call_plan(...)`` of the call, the same tuple object each time the caller
        makes the same call (the process group memoizes it): a repeated call at a known site
        is then recognised by identity, not field by field.
        """
        try:
            f = sys._getframe(depth)
        except ValueError:  # called from the top of a stack
            f = sys._getframe(1)
        code = f.f_code
        if _internal.get(code.co_filename, True):
            code, lasti = _walk_out(f)
        else:
            lasti = f.f_lasti
        key = (id(code), lasti, stream)
        site = self._plan_sites.get(key)
        if site is None or site[S_PLAN] is not plan or site[S_SHAPE] != shape:
            site = self._plan_site(key, stream, shape, plan, code, lasti)
        i = self._n
        self._n = i + 1
        self._rows[i % self.capacity] = row = [seq, tag, t0, None, site, label or _LABEL.get(),
                                               None, None]
        return row

    def _plan_site(self, key: tuple, stream: int, shape: Any, plan: tuple, code: Any,
                   lasti: int) -> tuple:
        sig, collective, count, dtype, op, root, algorithm, reason = plan
        site = (stream, collective, op, algorithm, reason, count, dtype, shape, root, code, lasti,
                sig, plan)
        if len(self._plan_sites) >= _SITES_MAX:
            self._plan_sites.clear()
        self._plan_sites[key] = site
        return site

    def _new_site(self, key: tuple, collective: str, stream: int, count: int, dtype: Any,
                  shape: Any, op: ReduceOp | None, root: int, algorithm: str | None,
                  reason: str | None, code: Any, lasti: int) -> tuple:
        sig = signature(collective, op, dtype, count, root, algorithm)
        site = (stream, collective, op, algorithm, reason, count, dtype, shape, root, code, lasti,
                sig, None)
        if len(self._sites) >= _SITES_MAX:
            self._sites.clear()
        self._sites[key] = site
        return site

    @staticmethod
    def end(row: list) -> None:
        """Mark a call finished (STATUS stays None: a row with an end time and no status is OK)."""
        row[T1] = time.perf_counter()

    def fail(self, row: list, error: BaseException) -> None:
        """Mark a call failed (TIMEOUT for a deadline) and keep the first line of the error."""
        from minidist.comm.errors import CommTimeout  # errors imports nothing from here

        row[T1] = time.perf_counter()
        row[STATUS] = CallStatus.TIMEOUT if isinstance(error, CommTimeout) else CallStatus.FAILED
        row[ERROR] = str(error).split("\n", 1)[0]
        self.failures += 1

    def counts(self) -> dict[int, int]:
        """``{stream: calls so far}``."""
        return dict(self._seq)

    # -- reading -----------------------------------------------------------------------------
    def _ordered_rows(self) -> list:
        rows = [r for r in self._rows if r is not None]
        rows.sort(key=lambda r: r[T0])
        return rows

    @staticmethod
    def status(row: list) -> CallStatus:
        """A row's status: set on failure; otherwise RUNNING until it has an end time."""
        st = row[STATUS]
        return st if st is not None else (_RUNNING if row[T1] is None else CallStatus.OK)

    def _as_dict(self, r: list) -> dict:
        wall = self._wall0 - self._perf0
        site = r[SITE]
        op, dt, root = site[S_OP], site[S_DTYPE], site[S_ROOT]
        return {"seq": r[SEQ], "stream": site[S_STREAM], "collective": site[S_COLLECTIVE],
                "op": op.value if op is not None else None, "algorithm": site[S_ALGORITHM],
                "reason": site[S_REASON], "count": int(site[S_COUNT]),
                "dtype": None if dt is None else np.dtype(dt).name,
                "shape": None if site[S_SHAPE] is None else [int(x) for x in site[S_SHAPE]],
                "root": None if root < 0 else int(root), "label": r[LABEL],
                "file": site[S_CODE].co_filename, "line": line_of(site[S_CODE], site[S_LASTI]),
                "start_s": wall + r[T0], "end_s": None if r[T1] is None else wall + r[T1],
                "status": self.status(r).value, "error": r[ERROR]}

    def records(self, stream: int | None = None, last: int | None = None) -> list[dict]:
        """Entries as JSON-able dicts, oldest first (optionally one stream, the last N)."""
        rows = [r for r in self._ordered_rows() if stream is None or r[SITE][S_STREAM] == stream]
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
