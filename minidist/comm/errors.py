"""Errors raised by the communication layer.

Messages follow one format, so a user reading a log from 64 ranks can act on any line:
``[rank R/N] <operation>: <what happened, with values>. <what to do>.``
"""

from __future__ import annotations


class CommError(RuntimeError):
    """A collective or point-to-point operation failed (peer gone, mismatch across ranks, ...)."""


class CommTimeout(CommError, TimeoutError):
    """A blocking wait passed its deadline (``MINIDIST_TIMEOUT_S``); the message names the peer."""
