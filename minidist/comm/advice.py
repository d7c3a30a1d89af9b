"""What a failure means and what to do about it, in one sentence (the "advise" part).

``failure_kind(error)`` sorts any exception into what happened, so a caller that wraps it (DDP's
communication thread) gives the advice that fits, and ``failure_advice(error)`` words it::

    CollectiveMismatch, or a diagnosis "mismatch"    -> "mismatch": the ranks disagree
    PeerExited                                       -> "exited": a peer left the job
    any other CommError (timeout, peer lost, ...)    -> "network": a peer stopped answering
    anything else (a kernel's error, a bug)          -> "local": this rank's own error
"""

from __future__ import annotations

from minidist.comm.errors import CollectiveMismatch, CommError, PeerExited
from minidist.comm.errors import CommTimeout  # noqa: F401 - failure_kind's example uses it


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
