"""A long silent wait says once, early, who it waits for and how long it may still last.

    waiting.check(group, src, tag)          # from the poll hook, at most once a second

Without it a rank waiting for a hung peer (or for ranks that never started) prints nothing
until ``MINIDIST_TIMEOUT_S`` (300 s by default) has passed. After ``wait_notice_s`` (the
failure policy's, 5 s) it logs one warning::

    [rank 0/2] WARNING minidist.watch.failure: all_reduce #6: waiting 5 s for rank 1 (nothing
    from it yet); the wait ends after MINIDIST_TIMEOUT_S=300 s (295 s more) with an error that
    names who did not answer. Ctrl-C ends the job now.

and nothing more for that wait: the next wait that lasts as long says it again.
"""

from __future__ import annotations

import time
from typing import Any

from minidist.logger import get_logger

log = get_logger("minidist.watch.failure")


def notice_text(where: str, waited_s: float, who: str, timeout_s: float) -> str:
    """The warning's text: who is waited for, for how long, and until when."""
    left = max(timeout_s - waited_s, 0.0)
    return (f"{where}: waiting {waited_s:.0f} s for {who}; the wait ends after "
            f"MINIDIST_TIMEOUT_S={timeout_s:g} s ({left:.0f} s more) with an error that names "
            "who did not answer. Ctrl-C ends the job now.")


CHECK_EVERY_S = 1.0  # the poll hook runs every few ms; a wait is sampled once a second
next_check: dict[int, float] = {}  # id(group) -> when to sample its wait next
_current: dict[int, tuple] = {}  # id(group) -> (the wait's key, since when, said yet)


def check(group: Any, src: int | None, tag: int) -> None:
    """Sample ``group``'s current wait (the poll hook calls this once a second): the same
    ``(src, tag, calls)`` as the last sample is the same wait; once it has lasted the policy's
    ``wait_notice_s``, log whom it waits for and how long it may still last, once."""
    now = time.monotonic()
    if len(next_check) > 64:  # groups come and go (tests make hundreds): forget old ones
        next_check.clear()
        _current.clear()
    next_check[id(group)] = now + CHECK_EVERY_S
    notice_s = group.failure_policy.wait_notice_s
    counts = group.ledger.counts()
    key = (src, tag, tuple(sorted(counts.items())))
    last = _current.get(id(group))
    if last is None or last[0] != key:
        _current[id(group)] = (key, now, False)
        return
    _, since, said = last
    if said or notice_s <= 0 or now - since < notice_s:
        return
    _current[id(group)] = (key, since, True)
    stream, n = max(counts.items()) if counts else (0, 0)
    entry = group.ledger.entries(stream, last=1) if n else []
    call = f"{entry[0].collective} #{n}" if entry else "wait"
    who = "the other ranks" if src is None else f"rank {src} (nothing from it yet)"
    where = group.where(call).split("] ", 1)[-1]  # the log line has the rank prefix
    log.warning("%s", notice_text(where, now - since, who, float(group.transport.timeout_s)))
