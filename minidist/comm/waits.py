"""What a long wait says, once, and after how long: a seam the watch wing fills.

    notice = waits.NOTICE          # None (the spine alone), or (after_s, text)
    after_s, text = notice         # text(where, waited_s, who, timeout_s) -> the warning

A wait that is not a collective's (the TCP rendezvous, before any process group exists)
reads this: the watch wing sets it when it loads (minidist/watch/attach.py: its policy's
``wait_notice_s`` and the words of every other long wait, failure/waiting.py).
"""

from __future__ import annotations

from typing import Callable

NOTICE: tuple[float, Callable[[str, float, str, float], str]] | None = None

__all__ = ["NOTICE"]
