"""Errors raised by the communication layer.

Messages follow one format, so a user reading a log from 64 ranks can act on any line:
``[rank R/N] <operation>: <what happened, with values>. <what to do>.``

    CommError                  a collective or point-to-point operation failed
      CommTimeout              a wait passed its deadline (MINIDIST_TIMEOUT_S)
      CollectiveMismatch       the ranks called different collectives (op, dtype, count, order)
        CollectiveMismatchTimeout   ... found by comparing ledgers after a timeout
      PeerFailed               another rank reported a failure while this rank waited
      PeerExited               another rank left the job (exit) while this rank waited for it

When a collective fails, the ranks compare their ledgers (``minidist.comm.diagnosis.ledger``) and
the error says where they first differ; ``error.diagnosis`` holds the same finding as a dict.

``failure_kind(error)`` sorts any exception into what happened, so a caller that wraps it (DDP's
communication thread) gives the advice that fits, and ``failure_advice(error)`` words it::

    CollectiveMismatch, or a diagnosis "mismatch"    -> "mismatch": the ranks disagree
    any other CommError (timeout, peer lost, ...)    -> "network": a peer stopped answering
    anything else (a kernel's error, a bug)          -> "local": this rank's own error
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
    for a peer that returned normally while the others still waited). See comm/leaving.py.
    """

    def __init__(self, message: str, peer: int, exit_code: int) -> None:
        super().__init__(message)
        self.peer, self.exit_code = peer, exit_code


def failure_kind(error: BaseException) -> str:
    """``"mismatch"`` (the ranks disagree), ``"exited"`` (a peer left through Python's exit),
    ``"network"`` (a peer or the network failed: timeout, lost connection, a peer's failure
    notice) or ``"local"`` (not a communication error).

    Example:
        >>> failure_kind(CommTimeout("[rank 0/2] recv(src=1): no message within 30 s."))
        'network'
        >>> failure_kind(ValueError("a kernel failed"))
        'local'
    """
    if isinstance(error, CollectiveMismatch):
        return "mismatch"
    if isinstance(error, PeerExited):
        return "exited"
    if isinstance(error, CommError):
        return "mismatch" if (error.diagnosis or {}).get("kind") == "mismatch" else "network"
    return "local"


def failure_peers(error: BaseException) -> list[int]:
    """The ranks a network failure names: the diagnosis' silent ranks, or the notifying peer."""
    missing = (getattr(error, "diagnosis", None) or {}).get("missing") or {}
    peers = sorted(int(r) for r in missing)
    peer = getattr(error, "peer", None)
    return peers or ([peer] if peer is not None else [])


def failure_advice(error: BaseException) -> str:
    """What to do about ``error``, in one sentence without its final period (see failure_kind)."""
    kind = failure_kind(error)
    if kind == "mismatch":
        return ("The ranks disagree: every rank must run the same model and the same steps "
                "(same parameters, same forward/backward calls)")
    if kind == "exited":
        peer, code = getattr(error, "peer", "?"), getattr(error, "exit_code", "?")
        if (getattr(error, "diagnosis", None) or {}).get("exit_code") == -1:
            code = "SystemExit or its script returned"  # the code is not visible here
        else:
            code = f"exit code {code}"
        return (f"Rank {peer} left the job ({code}) while this rank still waited for "
                f"it: see rank {peer}'s log for why it exited; every rank must stay until the "
                "last collective")
    if kind == "network":
        peers = failure_peers(error)
        who = (f"rank {peers[0]}" if len(peers) == 1 else
               f"ranks {', '.join(map(str, peers))}" if peers else "a peer")
        logs = (f"{who}'s log" if len(peers) == 1 else "their logs" if peers
                else "the other ranks' logs")
        lost = "their connections" if len(peers) > 1 else "its connection"
        return (f"{who[0].upper()}{who[1:]} stopped answering or lost {lost}: a dead peer or a "
                f"network failure, not a disagreement between the ranks; look at "
                f"{logs} and at the network between the nodes")
    return (f"An error on this rank itself ({type(error).__name__}), neither a disagreement "
            "between the ranks nor a network failure: see its traceback below")


def sentence(text: str) -> str:
    """``text`` without trailing periods and blanks, so a caller can append ". more." once."""
    return text.rstrip().rstrip(".").rstrip()
