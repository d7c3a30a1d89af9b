"""Step timeline: a Chrome-trace / Perfetto JSON file of what each rank did, and when.

    MINIDIST_TRACE=runs/trace ./mpirun.sh -n 2 python examples/train.py
    # runs/trace/trace-rank0.json, trace-rank1.json: one per rank, written at exit
    # runs/trace/trace.json: all ranks merged (Trainer.fit writes it at its end; otherwise
    #    .venv/bin/python -c "import minidist; minidist.tracing.merge('runs/trace')")
    # open either in https://ui.perfetto.dev or chrome://tracing

Each rank is a process (pid = rank) with two lanes (tid)::

    compute        forward | backward | optimizer.step     instants: bucket k ready, launch
                   wait for all-reduce (the EXPOSED communication of the step)
    communication  all-reduce bucket 0 | all-reduce bucket 1 ...   (bytes, algorithm, busbw)
                   instant: bucket k done                  counter: exposed comm [ms]

Who records what: the tape records ``backward`` (minidist/tensor/autograd.py), DDP records
``forward`` and each bucket (minidist/ddp/), the Trainer the ``step`` and ``optimizer.step``.
Events from DDP's communication thread go to the communication lane.

The API is tiny. A span around a block of the code it times is one line there, and with
tracing off it is a shared do-nothing context::

    with trace.span("backward"):            # the tape (autograd.run_backward)
        ...
    tr = trace.tracer()                     # the active Tracer, or None when tracing is off
    if tr is not None:                      # events that are not one block: instants, counters
        tr.instant("bucket 0 ready", args={"step": 3})

Times are ``time.perf_counter()`` seconds, written as microseconds on the wall clock (one
offset taken at start), so the ranks of one node line up exactly and ranks on different nodes
as well as their clocks agree.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ENV_VAR = "MINIDIST_TRACE"
COMPUTE = "compute"
COMM = "communication"
_TIDS = {COMPUTE: 0, COMM: 1}
MERGED_NAME = "trace.json"

# The active Tracer, or None when tracing is off: call sites read ``trace.active`` (a module
# attribute, so tracing off costs one attribute read, no call).
active: Tracer | None = None


class Tracer:
    """Collects one rank's events in memory; ``flush()`` writes ``<dir>/trace-rank<r>.json``.

    Args:
        directory: where the file goes (created if missing).
        rank: this process's rank (the trace's pid).
        world_size: number of ranks (recorded in the file).
        max_events: stop recording after this many events (memory stays bounded on long
            runs); the file then says ``"truncated": true``.
    """

    def __init__(self, directory: str | Path, rank: int, world_size: int,
                 max_events: int = 200_000) -> None:
        self.directory = Path(directory)
        self.rank, self.world_size = int(rank), int(world_size)
        self.max_events = max_events
        self.truncated = False
        self._offset_us = (time.time() - time.perf_counter()) * 1e6
        self._flushed = -1
        self.events: list[dict[str, Any]] = [
            {"name": "process_name", "ph": "M", "pid": self.rank, "tid": 0,
             "args": {"name": f"rank {self.rank}"}},
            {"name": "process_sort_index", "ph": "M", "pid": self.rank, "tid": 0,
             "args": {"sort_index": self.rank}},
        ]
        for lane, tid in _TIDS.items():
            self.events.append({"name": "thread_name", "ph": "M", "pid": self.rank, "tid": tid,
                                "args": {"name": lane}})
            self.events.append({"name": "thread_sort_index", "ph": "M", "pid": self.rank,
                                "tid": tid, "args": {"sort_index": tid}})

    @property
    def path(self) -> Path:
        return self.directory / f"trace-rank{self.rank}.json"

    @staticmethod
    def now() -> float:
        """The trace clock, in seconds (``time.perf_counter``)."""
        return time.perf_counter()

    def _us(self, t: float) -> float:
        return round(t * 1e6 + self._offset_us, 3)

    def _add(self, event: dict[str, Any]) -> None:
        if len(self.events) >= self.max_events:
            self.truncated = True
            return
        self.events.append(event)  # list.append is atomic: the comm thread may record too

    def complete(self, name: str, start: float, end: float, lane: str = COMPUTE,
                 cat: str = "step", args: dict[str, Any] | None = None) -> None:
        """A span from ``start`` to ``end`` (``now()`` values) on ``lane`` (Chrome "X" event)."""
        ev = {"name": name, "cat": cat, "ph": "X", "ts": self._us(start),
              "dur": round((end - start) * 1e6, 3), "pid": self.rank, "tid": _TIDS[lane]}
        if args:
            ev["args"] = args
        self._add(ev)

    def instant(self, name: str, lane: str = COMPUTE, cat: str = "bucket",
                args: dict[str, Any] | None = None, t: float | None = None) -> None:
        """A point in time on ``lane`` (Chrome "i" event), now unless ``t`` is given."""
        ev = {"name": name, "cat": cat, "ph": "i", "s": "t",
              "ts": self._us(self.now() if t is None else t), "pid": self.rank,
              "tid": _TIDS[lane]}
        if args:
            ev["args"] = args
        self._add(ev)

    def counter(self, name: str, values: dict[str, float], t: float | None = None) -> None:
        """A counter sample (Chrome "C" event): a value over time, drawn as a track."""
        self._add({"name": name, "ph": "C", "ts": self._us(self.now() if t is None else t),
                   "pid": self.rank, "tid": 0, "args": values})

    def flush(self) -> Path:
        """Write every event so far to ``path`` (atomically: temp file, then rename)."""
        if self._flushed == len(self.events) and self.path.exists():
            return self.path
        self.directory.mkdir(parents=True, exist_ok=True)
        data = {"traceEvents": list(self.events), "displayTimeUnit": "ms",
                "otherData": {"rank": self.rank, "world_size": self.world_size,
                              "truncated": self.truncated}}
        tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(data, separators=(",", ":")))
        os.replace(tmp, self.path)
        self._flushed = len(data["traceEvents"])
        return self.path


class Span:
    """One ``complete`` event from entering the ``with`` block to leaving it (also on an
    exception); made by ``span``."""

    __slots__ = ("tracer", "name", "lane", "args", "t0")

    def __init__(self, tracer: Tracer, name: str, lane: str, args: dict[str, Any] | None) -> None:
        self.tracer, self.name, self.lane, self.args = tracer, name, lane, args
        self.t0 = 0.0

    def __enter__(self) -> Span:
        self.t0 = self.tracer.now()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.tracer.complete(self.name, self.t0, self.tracer.now(), lane=self.lane, args=self.args)


_OFF = contextlib.nullcontext()  # what ``span`` returns while tracing is off


def span(name: str, lane: str = COMPUTE, args: dict[str, Any] | None = None
         ) -> Span | contextlib.nullcontext:
    """``with span("forward"): ...`` records the block as one span on ``lane`` of the active
    Tracer; with tracing off it is a do-nothing context (one check, no event)."""
    return _OFF if active is None else Span(active, name, lane, args)


def tracer() -> Tracer | None:
    """The active Tracer, or None when tracing is off (the check every call site makes)."""
    return active


def start(directory: str | Path, rank: int, world_size: int) -> Tracer:
    """Start tracing this process into ``directory`` (flushed at ``stop()`` and at exit).

    A tracer that is already active is returned as it is.
    """
    global active
    if active is None:
        active = Tracer(directory, rank, world_size)
        atexit.register(_flush_at_exit, active)
    return active


def start_from_env(rank: int, world_size: int) -> Tracer | None:
    """``start(os.environ["MINIDIST_TRACE"], ...)`` if that variable is set, else None."""
    directory = os.environ.get(ENV_VAR)
    if not directory:
        return active
    return start(directory, rank, world_size)


def stop() -> Path | None:
    """Flush and deactivate the active tracer; returns its file (None if none was active)."""
    global active
    tr, active = active, None
    return tr.flush() if tr is not None else None


def _flush_at_exit(tr: Tracer) -> None:
    try:
        tr.flush()
    except OSError as e:  # at exit there is nobody left to raise to
        sys.stderr.write(f"[rank {tr.rank}/{tr.world_size}] trace: could not write "
                         f"{tr.path}: {e}\n")


def merge(directory: str | Path, out: str | Path | None = None) -> Path:
    """Merge every ``trace-rank*.json`` in ``directory`` into one file (default ``trace.json``).

    Each rank keeps its own pid, so the merged timeline shows the ranks one under another.

    Raises:
        FileNotFoundError: no per-rank trace files in ``directory``.
    """
    directory = Path(directory)
    files = sorted(directory.glob("trace-rank*.json"),
                   key=lambda p: int(p.stem.removeprefix("trace-rank") or 0))
    if not files:
        raise FileNotFoundError(f"trace.merge: no trace-rank*.json files in {directory}. Run "
                                f"the job with {ENV_VAR}={directory} first.")
    events: list = []
    ranks = []
    for f in files:
        data = json.loads(f.read_text())
        events += data["traceEvents"]
        ranks.append(data.get("otherData", {}).get("rank"))
    path = Path(out) if out is not None else directory / MERGED_NAME
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms",
                               "otherData": {"ranks": ranks}}, separators=(",", ":")))
    os.replace(tmp, path)
    return path


# This module was minidist/trace.py; ``minidist.trace`` is now torch's function, and the old
# import path (``from minidist.trace import ...``) still finds this module.
sys.modules.setdefault("minidist.trace", sys.modules[__name__])
