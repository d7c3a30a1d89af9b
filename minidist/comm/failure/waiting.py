"""A long silent wait says once, early, who it waits for and how long it may still last.

    waits = SlowWait()                      # one per process group (or rendezvous)
    waits.check(group, src, tag)            # from the poll hook, every few ms of a slow wait

Without it a rank waiting for a hung peer (or for ranks that never started) prints nothing
until ``MINIDIST_TIMEOUT_S`` (300 s by default) has passed. After ``wait_notice_s`` (the
failure policy's, 5 s) it logs one warning::

    [rank 0/2] WARNING minidist.comm.failure: all_reduce #6: waiting 5 s for rank 1 (nothing
    from it yet); the wait ends after MINIDIST_TIMEOUT_S=300 s (295 s more) with an error that
    names who did not answer. Ctrl-C ends the job now.

and nothing more for that wait: the next wait that lasts as long says it again.
"""

from __future__ import annotations

import time
from typing import Any

from minidist.log import get_logger

log = get_logger("minidist.comm.failure")


def notice_text(where: str, waited_s: float, who: str, timeout_s: float) -> str:
    """The warning's text: who is waited for, for how long, and until when."""
    left = max(timeout_s - waited_s, 0.0)
    return (f"{where}: waiting {waited_s:.0f} s for {who}; the wait ends after "
            f"MINIDIST_TIMEOUT_S={timeout_s:g} s ({left:.0f} s more) with an error that names "
            "who did not answer. Ctrl-C ends the job now.")


class SlowWait:
    """Tracks the current wait of one process group; warns once when it has lasted long."""

    def __init__(self) -> None:
        self.key: tuple | None = None
        self.since = 0.0
        self.said = False

    def check(self, group: Any, src: int | None, tag: int) -> None:
        """Called from the poll hook: the same ``(src, tag, calls)`` again is the same wait."""
        notice_s = group.failure_policy.wait_notice_s
        if notice_s <= 0:
            return
        now = time.monotonic()
        counts = group.ledger.counts()
        key = (src, tag, tuple(sorted(counts.items())))
        if key != self.key:
            self.key, self.since, self.said = key, now, False
            return
        if self.said or now - self.since < notice_s:
            return
        self.said = True
        stream, n = max(counts.items()) if counts else (0, 0)
        last = group.ledger.entries(stream, last=1) if n else []
        call = f"{last[0].collective} #{n}" if last else "wait"
        who = "the other ranks" if src is None else f"rank {src} (nothing from it yet)"
        where = group.where(call).split("] ", 1)[-1]  # the log line has the rank prefix
        log.warning("%s", notice_text(where, now - self.since, who,
                                      float(group.transport.timeout_s)))
