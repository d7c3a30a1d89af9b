"""One rank the launcher started: its process, its output relayed line by line with a
``[rank r]`` prefix, and the notice it sends as it begins to end.

A rank's ``Notice`` (``kind``, ``line``, ``blames``) arrives on the channel named by
``MINIDIST_LAUNCH_FD`` (``NOTICE_FD_VAR``; minidist.watch.failure.notice writes it). Output
relay keeps ranks' lines apart and lets a progress bar move (``_prefixed``, one open line on
a screen at a time). ``python -m minidist.launch`` (minidist/launch.py) uses ``Rank``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import threading
from typing import IO

NOTICE_FD_VAR = "MINIDIST_LAUNCH_FD"  # the rank's end of its notice channel


@dataclasses.dataclass(frozen=True)
class Notice:
    """What a rank said as it began to end (minidist.watch.failure.notice writes it)."""

    kind: str  # "exception", "exit" or "interrupted"
    line: str  # the exception's "Type: message", or what happened
    blames: tuple[int, ...]  # peers it failed because of (empty: its own failure)
    t: float  # when (time.time() on the rank)

    @staticmethod
    def parse(raw: bytes) -> "Notice":
        d = json.loads(raw)
        return Notice(str(d["kind"]), str(d.get("line") or ""),
                      tuple(int(b) for b in d.get("blames") or ()), float(d["t"]))


# Which (rank, stream) left a line open on the terminal (a progress bar), if any.
_SCREEN: dict[str, tuple | None] = {"open": None}
_SCREEN_LOCK = threading.Lock()


class Rank:
    """One child process, its global rank, and the last line it printed."""

    def __init__(self, rank: int, proc: subprocess.Popen) -> None:
        self.rank, self.proc, self.last_line = rank, proc, ""
        self.readers: list[threading.Thread] = []
        self.notice: Notice | None = None  # what the rank said when it began to end, if it did

    def relay(self, src: IO[bytes], dst: IO[bytes]) -> None:
        """Copy the rank's output to ``dst``, each line prefixed with ``[rank r]``.

        Whole lines go out in one write each, so ranks' lines never run together. A progress
        bar redraws its line after ``\r`` without ending it: that part goes out at once (each
        redraw prefixed), so the bar moves instead of arriving whole at the end of the epoch.
        A line that already starts with the rank's own prefix (minidist's logging writes
        ``[rank r/N] ...``) is left as is.
        """
        prefix = f"[rank {self.rank}] ".encode()
        own = (f"[rank {self.rank}/".encode(), prefix)
        pending, mid_line = b"", False  # mid_line: part of the current line is already out
        while True:
            chunk = src.read1(65536) if hasattr(src, "read1") else src.readline()
            if not chunk:
                break
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                self._write(dst, _prefixed(line + b"\n", prefix, own, mid_line), False)
                mid_line = False
            if b"\r" in pending:  # a bar's redraw: show it now
                self._write(dst, _prefixed(pending, prefix, own, mid_line), True)
                pending, mid_line = b"", True
        if pending:
            self._write(dst, _prefixed(pending + b"\n", prefix, own, mid_line), False)
        src.close()

    def _write(self, dst: IO[bytes], data: bytes, partial: bool) -> None:
        """Write ``data``; ``partial``: it leaves its line open (a progress bar). Another
        stream's line first ends an open one, so the two never share a line."""
        text = [t for t in data.decode(errors="replace").replace("\r", "\n").splitlines()
                if t.strip()]
        if text:
            self.last_line = text[-1].strip()
        with _SCREEN_LOCK:
            try:
                if _SCREEN["open"] not in (None, (self.rank, dst)) and _same_screen(
                        _SCREEN["open"][1], dst):
                    dst.write(b"\n")
                dst.write(data)
                dst.flush()
            except (OSError, ValueError):  # our own stdout closed: keep draining the pipe
                pass
            _SCREEN["open"] = (self.rank, dst) if partial else None

    def signal_group(self, sig: int) -> None:
        if self.proc.poll() is None or sig == signal.SIGKILL:
            try:
                os.killpg(self.proc.pid, sig)  # the rank and anything it started
            except (ProcessLookupError, PermissionError):
                pass


def _same_screen(a: IO[bytes], b: IO[bytes]) -> bool:
    """Whether text written to ``a`` and ``b`` lands on one screen (one stream, or two
    terminals): only then does an open line on ``a`` need ending before ``b`` writes."""
    if a is b:
        return True
    try:
        return os.isatty(a.fileno()) and os.isatty(b.fileno())
    except (OSError, ValueError, AttributeError):
        return False


def _prefixed(data: bytes, prefix: bytes, own: tuple, mid_line: bool) -> bytes:
    """``data`` with ``prefix`` at the start of its line and after each ``\r`` (a redraw),
    except where the line already starts with ``own`` or continues text already written."""
    parts = data.split(b"\r")
    out = []
    for k, seg in enumerate(parts):
        bare = (k == 0 and mid_line) or not seg or seg.startswith(own) or (k > 0 and seg == b"\n")
        out.append(seg if bare else prefix + seg)
    return b"\r".join(out)


def exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode
