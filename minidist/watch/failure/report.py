"""How a rank reports an uncaught error: one block, written at once, the finding said once.

    block = uncaught_block(exc_type, exc, tb, "[rank 0/2]", "in the main thread", 2)
    write_block(block)           # one os.write: lines of two ranks never run together

A collective's failure reaches the user's excepthook after the ranks compared ledgers, and
``failure.on_failure`` has already logged the finding (``[rank r/N] ERROR ...``, printed before
the job ends so that every rank's is on record). The block then adds only where the program
called the collective (the frames outside minidist), not the finding again nor the chain of
internal errors that led to it::

    [rank 0/2] ERROR minidist.watch.failure: CollectiveMismatch: all_reduce #2: ...   (logged)
    [rank 0/2] Traceback (the calls outside minidist; MINIDIST_DEBUG=1 shows all):
    [rank 0/2]   File "train.py", line 38, in step
    [rank 0/2]     g.all_reduce(b)
    [rank 0/2] minidist.comm.errors.CollectiveMismatch: this rank's ERROR line above
    [rank 0/2] uncaught exception in the main thread; ending the job on all 2 ranks.

Any other ``CommError`` gets the same short traceback with its message; any other exception
(and every one with ``MINIDIST_DEBUG=1``) Python's full traceback, prefixed line by line.
"""

from __future__ import annotations

import io
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from minidist.comm.errors import CommError
from minidist.logger import debug_level

_PACKAGE = str(Path(__file__).resolve().parents[2])  # .../minidist (watch/failure/report.py)


def _outside_package(tb: Any) -> list:
    frames = traceback.extract_tb(tb)
    mine = [f for f in frames if not str(Path(f.filename).resolve()).startswith(_PACKAGE)]
    return mine or frames[-1:]


def uncaught_block(exc_type: Any, exc: Any, tb: Any, prefix: str, where: str,
                   world_size: int) -> str:
    """The text a rank prints for an uncaught exception, every line prefixed."""
    if isinstance(exc, CommError) and debug_level() == 0:
        said = ("this rank's ERROR line above" if exc.logged else str(exc).split("\n", 1)[0])
        lines = ["Traceback (the calls outside minidist; MINIDIST_DEBUG=1 shows all):"]
        lines += "".join(traceback.format_list(_outside_package(tb))).rstrip().splitlines()
        lines.append(f"{exc_type.__module__}.{exc_type.__name__}: {said}")
    else:
        text = "".join(traceback.format_exception(exc_type, exc, tb))
        lines = text.rstrip().splitlines()
    lines.append(f"uncaught exception {where}; ending the job on all {world_size} ranks.")
    return "".join(f"{prefix} {line}\n" for line in lines)


def write_block(text: str, fd: int = 2) -> None:
    """Write ``text`` to ``fd`` in one system call where the pipe allows (after flushing what
    Python buffered), so a launcher that merges ranks' output keeps the block together."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    data = text.encode(errors="replace")
    while data:
        try:
            n = os.write(fd, data)
        except InterruptedError:
            continue
        except OSError:
            return
        data = data[n:]


class WholeLineWriter(io.TextIOWrapper):
    """A text stream that hands the OS whole lines: it writes (flushes) once the text it was
    given ends a line, so ``print("a\\nb")`` is one write of ``"a\\nb\\n"``, not ``"a\\nb"`` then
    ``"\\n"`` as a line-buffered stream does (another rank's line could land between them).
    An explicit ``flush()`` (``print(..., flush=True)``, a progress bar) still writes at once."""

    def write(self, s: str) -> int:
        n = super().write(s)
        if s.endswith("\n"):
            self.flush()
        return n


_replaced: list = []  # the streams WholeLineWriter replaced: kept, so their buffer stays open


def whole_lines() -> None:
    """Make ``print`` and logging reach the launcher one whole line per write.

    A launcher merges the ranks' output as it reads it. When Python writes unbuffered
    (``PYTHONUNBUFFERED``, ``-u``) or line-buffered, ``print("BACKEND", rank)`` or a
    multi-line ``print`` is several writes, and another rank's line can land between them:
    ``BACKENDBACKEND 0 ...``, ``-> [3.0, 3.0][rank 1/3] ...``. ``sys.stdout`` and ``sys.stderr``
    become a ``WholeLineWriter`` over the same file, which writes at the end of each line, in
    one piece (``init_process_group`` calls this; a terminal is left alone).
    """
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if (isinstance(stream, WholeLineWriter) or not isinstance(stream, io.TextIOWrapper)
                or not (stream.write_through or stream.line_buffering) or stream.isatty()):
            continue
        try:
            stream.flush()
            writer = WholeLineWriter(stream.buffer, encoding=stream.encoding,
                                     errors=stream.errors, line_buffering=False,
                                     write_through=False)
        except (OSError, ValueError, AttributeError):
            continue
        _replaced.append(stream)
        setattr(sys, name, writer)
