"""What the ranks do when a collective fails: exchange ledgers, diagnose, raise the same finding.

    except CommError as e:                        # every ProcessGroup collective, through
        raise group.calls.failed(call, e) from e  # calls.py, which ends here

The exchange runs on the transport's side channel (transports/base.py), which does not depend
on the stuck call::

    rank that failed first              other ranks
    SIDE_FAIL(report) --> every peer    a wait in any collective polls the side channel in its
                                        slow phase (every 2 ms) and raises PeerFailed; the
                                        group lands here too and sends its own SIDE_FAIL
    collect every peer's SIDE_FAIL      (a rank in destroy_process_group answers as well)
      until exchange_s passes           dead peer (TCP: connection closed) -> "is dead"
    diagnose (comm/diagnose.py)         no answer -> "did not answer within N s"
    log the finding (stderr, ERROR)
    SIDE_DONE --> peers that answered   (so every rank has printed its finding before a first
    wait for their SIDE_DONE            one ends the MPI job through its excepthook)
    raise CollectiveMismatch / CommTimeout / CommError with the finding

``poll`` is the check a waiting rank runs every few milliseconds (the transports' poll hook): a
peer's failure notice, a stray message of another call, a peer already past this call or already
gone (SIDE_BYE). ``farewell`` (``destroy_process_group``): every rank sends its collective counts
(SIDE_BYE) and waits for the others' (up to the deadline plus the policy's exchange_s; a rank that
never arrives is only a warning). Counts that differ, or a peer's failure notice, are a failure of
the same kind: so a rank that skipped a collective and finished "successfully" raises too, naming
the call.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from minidist.watch.diagnosis.diagnose import diagnose
from minidist.comm.errors import (CollectiveMismatch, CollectiveMismatchTimeout, CommError,
                                  CommTimeout, PeerFailed)
from minidist.comm.advice import failure_peers
from minidist.watch.failure import waiting
from minidist.watch.failure import notice
from minidist.watch.diagnosis.ledger import dump_dir
from minidist.watch.failure.leaving import bye_payload, parse_bye, peer_exited, peer_left
from minidist.comm.transports.base import (DEFAULT_TIMEOUT_S, SIDE_BYE, SIDE_DONE, SIDE_FAIL,
                                           Transport, has_fingerprint)
from minidist.logger import get_logger

log = get_logger("minidist.watch.failure")  # the name users filter on (docs/troubleshooting.md)

REPORT_ENTRIES = 64    # ledger entries each rank sends (the dump has all of them)
_POLL_S = 0.001
# A peer's shared-memory call counter is visible at once, while the message it sent before
# that call may still be on its way (MPI progresses it later, more so on a loaded machine):
# "the peer is past this call" counts only once it has held this long.
AHEAD_GRACE_S = 2.0
_ahead_seen: dict[tuple, float] = {}


def exchange_timeout_s(transport: Transport, limit_s: float) -> float:
    """How long to wait for the peers' reports: ``min(limit_s, the transport's timeout)``
    (``limit_s``: the group's failure policy's ``exchange_s``, the one owner of that number)."""
    return min(limit_s, float(transport.timeout_s or limit_s))


def _collect(t: Transport, kind: int, peers: list[int], timeout_s: float,
             waited_s: float | None = None) -> tuple[dict[int, bytes], dict[int, str]]:
    """Side messages of ``kind`` from ``peers`` until all came or ``timeout_s`` passed.

    ``waited_s``: how long this rank had already waited for the silent peers (a timed-out
    collective: the configured MINIDIST_TIMEOUT_S), named in the message instead of the
    exchange's own ``timeout_s``. Returns ``(got, missing)``: rank -> payload, rank -> why
    nothing came.
    """
    got: dict[int, bytes] = {}
    missing: dict[int, str] = {}
    pending = list(peers)
    deadline = time.monotonic() + timeout_s
    while pending:
        for p in list(pending):
            data = t.side_channel.try_recv(p, kind)
            if data is not None:
                got[p] = data
                pending.remove(p)
                continue
            if t.side_channel.peer_lost(p) is not None:
                missing[p] = "is dead: its connection closed (it exited or crashed)"
                pending.remove(p)
        if not pending or time.monotonic() > deadline:
            break
        time.sleep(_POLL_S)
    for p in pending:
        missing[p] = (f"did not answer within {waited_s or timeout_s:g} s (it is dead, busy "
                      "outside minidist, or has exited)")
    return got, missing


def _report(group: Any, state: str, error: str | None) -> dict:
    return {"rank": group.rank, "state": state, "error": error,
            "counts": {str(k): v for k, v in group.ledger.counts().items()},
            "entries": group.ledger.records(last=REPORT_ENTRIES)}


def _how(error: BaseException) -> str:
    how = getattr(error, "how", None)  # set by the checks that found it (group._poll)
    if how:
        return how
    if isinstance(error, PeerFailed):
        return f"after rank {error.peer} reported its failure"
    if isinstance(error, CommTimeout):
        return "after a timeout"
    if isinstance(error, CollectiveMismatch):
        return "by the call fingerprints"
    first = str(error).split("\n", 1)[0].split("] ", 1)[-1].split(". ", 1)[0]
    return f"after this error: {first.rstrip('.')}"


FIX = {
    "mismatch": "Every rank must call the same collectives in the same order, with the same "
                "count, dtype, op, root and label; fix the calls at those lines",
    "missing": "Look at that rank's own output for its first error; if it is only slow (a long "
               "checkpoint, I/O), raise MINIDIST_TIMEOUT_S",
    "same": "No rank called anything different: a rank may be too slow (raise "
            "MINIDIST_TIMEOUT_S) or the transport failed",
}


def exchange(group: Any, stream: int, state: str, error: BaseException) -> tuple[dict, list]:
    """Send this rank's report to every peer, collect theirs, diagnose ``stream``.

    Returns ``(diagnosis, ranks that answered)``.
    """
    t = group.transport
    mine = _report(group, state, str(error).split("\n", 1)[0])
    peers = [p for p in range(group.size) if p != group.rank]
    data = json.dumps(mine).encode()
    for p in peers:
        t.side_channel.send(p, SIDE_FAIL, data)
    waited = float(t.timeout_s) if isinstance(error, CommTimeout) and t.timeout_s else None
    got, missing = _collect(t, SIDE_FAIL, peers,
                            exchange_timeout_s(t, group.failure_policy.exchange_s), waited)
    reports = {group.rank: mine}
    for p, raw in got.items():
        try:
            reports[p] = json.loads(raw.decode())
        except ValueError:
            missing[p] = "sent an unreadable report"
    return diagnose(stream, reports, missing), [p for p in peers if p in reports]


def _done(t: Transport, answered: list[int], limit_s: float) -> None:
    """Tell the ranks that answered that this rank has its finding; wait for theirs."""
    for p in answered:
        t.side_channel.send(p, SIDE_DONE, b"1")
    _collect(t, SIDE_DONE, answered, exchange_timeout_s(t, limit_s) + 1.0)


def on_failure(group: Any, row: Any, error: BaseException, call: str) -> BaseException:
    """Turn ``error`` (a collective's failure on this rank) into the diagnosed error to raise.

    ``row``: the failed ``Call`` (comm/calls.py; its observers, the ledger among them, have
    marked it), or None outside a call. With the ledger off or one rank, returns ``error``
    unchanged.
    """
    ledger = group.ledger
    if (not ledger.enabled or group.size == 1 or not group.failure_policy.diagnose_on_failure
            or getattr(error, "diagnosis", None) is not None):
        return error
    left = peer_left(group)  # a peer that exited explains it (e.g. its closed connection)
    if left is not None:
        return left
    if row is not None:
        stream, seq = row.stream, row.seq
        status = "timed out" if isinstance(error, CommTimeout) else "failed"
        state = f"{status} in {row.spec.collective} #{seq}"
        where = f"{call} #{seq}"
    else:
        stream, seq = 0, None
        state, where = "in destroy_process_group", call
    try:
        diag, answered = exchange(group, stream, state, error)
    except Exception as e:  # noqa: BLE001 - the diagnosis must never hide the real error
        log.warning("ledger exchange failed (%s: %s); raising the original error",
                    type(e).__name__, e)
        return error
    text = diag["text"] if diag["kind"] == "missing" else f"{diag['text']} (found {_how(error)})"
    dump = dump_dir()
    fix = FIX[diag["kind"]]
    if dump:
        try:
            path = ledger.dump(dump, {"failure": diag, "error": text})
            fix += f" (this rank's ledger: {path})"
        except OSError as e:
            log.warning("could not write the ledger to %s: %s", dump, e)
    else:
        fix += " (set MINIDIST_LEDGER_DUMP=dir to keep every rank's ledger)"
    if diag["kind"] == "mismatch":
        cls: type = (CollectiveMismatchTimeout if isinstance(error, CommTimeout)
                     else CollectiveMismatch)
    else:
        cls = type(error) if not isinstance(error, PeerFailed) else CommError
    what = "the ranks called different collectives: " if diag["kind"] == "mismatch" else ""
    message = f"{group.where(where)}: {what}{text}. {fix}."
    try:
        out = cls(message)
    except TypeError:  # an error class with another constructor
        out = CommError(message)
    out.diagnosis = diag
    # Under the launcher, a rank that failed because a peer died says so first: the launcher
    # names the dead peer and stops this rank before it repeats the news.
    if failure_peers(out) and diag["kind"] == "missing":
        notice.tell("exception", f"{type(out).__name__}: {message}", failure_peers(out))
    # Printed here, before the DONE round: under MPI the first rank to raise ends the job
    # (excepthook -> Abort), and every rank's finding should be on record by then.
    log.error("%s: %s", type(out).__name__, message.split("] ", 1)[-1])
    out.logged = True  # an uncaught one is not printed again (watch/failure/report.py)
    _done(group.transport, answered, group.failure_policy.exchange_s)
    return out


def poll(group: Any, src: int | None, tag: int) -> CommError | None:
    """The transport's poll hook (base.py "Polling"): why a slow wait cannot succeed.

    Checked every few milliseconds while a wait lasts: a peer's failure notice; a message
    from ``src`` on this stream with another call's fingerprint (the ranks called
    different collectives: per-pair order means the awaited message would have come
    first); a peer that already said goodbye (destroy_process_group) with fewer calls than
    this rank has started.
    """
    t = group.transport
    failed = t.side_channel.pending(SIDE_FAIL)
    if failed is not None:
        return PeerFailed(f"{group.where('wait')}: rank {failed} reported a failed "
                          "collective.", failed)
    if time.monotonic() > waiting.next_check.get(id(group), 0.0):  # at most once a second
        waiting.check(group, src, tag)  # a long wait says whom it waits for, once
    if not group.ledger.enabled or group.size == 1:
        return None
    if src is not None and has_fingerprint(tag):
        other = t.side_channel.stray_tag(src, tag)
        if other is not None:
            err = CollectiveMismatch(
                f"{group.where('wait')}: rank {src} sent a message of another collective "
                f"(tag {other}, awaited tag {tag}): the ranks called different collectives.")
            err.how = f"when rank {src} sent a message of another call"
            return err
        # src already posted an MPI Allreduce this rank has not: it is past this call
        # (only with one stream: another thread's MPI calls would look the same).
        ahead = group.mpi_calls_ahead(src) if len(group.ledger.counts()) == 1 else 0
        if ahead and _held(group, src, ahead):
            err = CollectiveMismatch(
                f"{group.where('wait')}: rank {src} is already in MPI collective call "
                f"{ahead}, which this rank has not called, instead of sending the awaited "
                "message: the ranks called different collectives.")
            err.how = f"when rank {src} started an MPI collective this rank has not called"
            return err
    left = peer_left(group)  # reads the peers' goodbyes (SIDE_BYE) into group.farewells
    if left is not None:
        return left
    if group.farewells:
        mine = group.ledger.counts()
        for p, theirs in group.farewells.items():
            for stream, n in mine.items():
                if theirs.get(stream, 0) < n:
                    err = CollectiveMismatch(
                        f"{group.where('wait')}: rank {p} has finished (it called "
                        f"destroy_process_group after {theirs.get(stream, 0)} collectives "
                        f"on stream {stream}), so it will not join collective #{n}.")
                    err.how = f"when rank {p} reached destroy_process_group"
                    return err
    return None


def _held(group: Any, src: int, ahead: int) -> bool:
    """True once ``src`` has been seen ahead (at MPI call ``ahead``) for AHEAD_GRACE_S."""
    key = (id(group), src, ahead, tuple(sorted(group.ledger.counts().items())))
    now = time.monotonic()
    if len(_ahead_seen) > 64:
        _ahead_seen.clear()
    return now - _ahead_seen.setdefault(key, now) >= AHEAD_GRACE_S


def farewell(group: Any) -> None:
    """``destroy_process_group``'s check: do all ranks agree on how many collectives they made?

    Skipped with the ledger off, one rank, after a failure, or while an exception propagates.

    Raises:
        CollectiveMismatch: the counts differ (names the first call where the ledgers differ).
        CommError: a peer reported a failure while this rank waited here.
    """
    ledger, t = group.ledger, group.transport
    if (not ledger.enabled or group.size == 1 or ledger.failures
            or sys.exc_info()[0] is not None):
        return
    peers = [p for p in range(group.size) if p != group.rank]
    counts = ledger.counts()
    data = bye_payload(counts)
    for p in peers:
        t.side_channel.send(p, SIDE_BYE, data)
    timeout_s = (float(t.timeout_s or DEFAULT_TIMEOUT_S)
                 + exchange_timeout_s(t, group.failure_policy.exchange_s))
    deadline = time.monotonic() + timeout_s
    theirs: dict[int, dict] = dict(group.farewells)  # what the poll hook already read
    pending = [p for p in peers if p not in theirs]
    while pending and time.monotonic() < deadline:
        failed = t.side_channel.pending(SIDE_FAIL)
        if failed is not None:
            raise on_failure(group, None, PeerFailed(
                f"{group.where('destroy_process_group')}: rank {failed} reported a failed "
                "collective.", failed), "destroy_process_group")
        for p in list(pending):
            raw = t.side_channel.try_recv(p, SIDE_BYE)
            if raw is not None:
                theirs[p], code = parse_bye(raw)
                if code is not None:
                    group.exit_codes[p] = code
                pending.remove(p)
            elif t.side_channel.peer_lost(p) is not None:
                pending.remove(p)
        time.sleep(_POLL_S)
    if pending:
        log.warning("destroy_process_group: ranks %s did not reach destroy_process_group within "
                    "%.0f s; the collective counts were not compared.", pending, timeout_s)
    differ = [p for p, c in theirs.items() if c != counts]
    if differ and differ[0] in group.exit_codes:
        p = differ[0]
        raise peer_exited(group, "destroy_process_group", p, group.exit_codes[p],
                          theirs[p].get(0, 0))
    if differ:
        error = CollectiveMismatch(
            f"{group.where('destroy_process_group')}: rank {differ[0]} made "
            f"{theirs[differ[0]].get(0, 0)} collectives but this rank made {counts.get(0, 0)}.")
        error.how = "at destroy_process_group, where the ranks' collective counts differ"
        raise on_failure(group, None, error, "destroy_process_group")

