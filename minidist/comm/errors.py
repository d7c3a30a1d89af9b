"""Errors raised by the communication layer.

Messages follow one format, so a user reading a log from 64 ranks can act on any line:
``[rank R/N] <operation>: <what happened, with values>. <what to do>.``

    CommError                  a collective or point-to-point operation failed
      CommTimeout              a wait passed its deadline (MINIDIST_TIMEOUT_S)
      CollectiveMismatch       the ranks called different collectives (op, dtype, count, order)
        CollectiveMismatchTimeout   ... found by comparing ledgers after a timeout
      PeerFailed               another rank reported a failure while this rank waited
      PeerExited               another rank left the job (exit) while this rank waited for it

When a collective fails, the ranks compare their ledgers (``minidist.watch.diagnosis.ledger``) and
the error says where they first differ; ``error.diagnosis`` holds the same finding as a dict.

What a failure means and what to do about it (the advice a wrapped error carries) is in
``minidist.comm.advice``.
"""

from __future__ import annotations

from typing import Any


class CommError(RuntimeError):
    """A collective or point-to-point operation failed (peer gone, mismatch across ranks, ...).

    ``diagnosis``: the ledger comparison's finding (a dict), once the ranks made it; ``how``:
    which check found the failure, in words (for the message).
    """

    diagnosis: dict[str, Any] | None = None
    how: str | None = None
    logged: bool = False  # its message is already on stderr (failure.on_failure logs it)


class CommTimeout(CommError, TimeoutError):
    """A blocking wait passed its deadline (``MINIDIST_TIMEOUT_S``); the message names the peer."""


class CollectiveMismatch(CommError):
    """The ranks called different collectives, or the same one with different arguments.

    Found in-band (message fingerprints, shared-memory headers) or by the ledger comparison
    after a failure. The message names the call number, the collective on each side and the
    ranks that differ.
    """


class CollectiveMismatchTimeout(CollectiveMismatch, CommTimeout):
    """A collective timed out, and the ledgers show why: the ranks called different ones."""


class PeerFailed(CommError):
    """Another rank reported a failed collective while this rank was waiting for a message.

    Raised inside the transports' waits; the process group turns it into the ledger diagnosis.
    """

    def __init__(self, message: str, peer: int) -> None:
        super().__init__(message)
        self.peer = peer


class PeerExited(CommError):
    """Another rank left the job through Python's exit while this rank waited for it.

    ``peer``: that rank; ``exit_code``: the code this job should end with (the peer's, or 1
    for a peer that returned normally while the others still waited). See watch/failure/leaving.py.
    """

    def __init__(self, message: str, peer: int, exit_code: int) -> None:
        super().__init__(message)
        self.peer, self.exit_code = peer, exit_code
