"""A rank that leaves the job through Python's exit, with its process group still open.

    md.init_process_group()
    md.all_reduce(x)
    if md.get_rank() == 1:
        sys.exit(3)              # rank 1 leaves; rank 0 goes on to its next collective
    md.all_reduce(x)             # rank 0: "rank 1 exited with code 3 ..." at once, job exit 3

Left alone, rank 1 would sit in ``MPI_Finalize`` (mpi4py calls it at exit, and it waits for the
others) while rank 0 waits for rank 1 in its collective until ``MINIDIST_TIMEOUT_S``, and the
job would end with rank 0's code instead of 3. Instead, at exit (``atexit``, which runs before
mpi4py's ``MPI_Finalize``) the leaving rank tells its peers over the side channel::

    leaving rank (at exit)                       every other rank
    SIDE_BYE {counts, "exit": code} --> peers    a wait in a collective polls the side channel
    code 0, or not MPI: go on exiting            (failure.poll; also when a connection closes):
    MPI and a nonzero code: wait until every     a BYE with fewer calls and an exit code ->
      peer finished too (a BYE with the same     PeerExited "rank 1 exited with code 3 ...";
      counts), at most GRACE_S; if one did       the excepthook ends the job with that code
      not: one line, then MPI Abort(code)        (1 for a rank that returned normally: a job
                                                 whose ranks did not finish together failed);
                                                 not MPI: once the peer is gone, so that a
                                                 launcher names the rank that left

A job in which every rank finishes (with or without ``destroy_process_group``) ends as before:
the goodbyes agree, nothing is raised or printed. The exit code is the one given to
``sys.exit(n)``, ``exit(n)`` or ``quit(n)`` (wrapped while the group is open); a script that
returns (or raises ``SystemExit`` itself) counts as 0. With the ledger off
(``MINIDIST_LEDGER=0``) nothing is sent.
"""

from __future__ import annotations

import atexit
import builtins
import json
import os
import socket
import sys
import time
from typing import Any, Callable

from minidist.comm.errors import PeerExited
from minidist.comm.transports.base import DEFAULT_TIMEOUT_S, SIDE_BYE, SIDE_FAIL
from minidist.logger import rank_prefix

UNKNOWN_EXIT = -1  # the BYE's exit code of a rank whose script returned or raised SystemExit:
                   # Python does not show that code inside the process (only its parent sees it)
EXIT_KEY = "exit"   # the BYE payload's entry for the exit code (the others are stream counts)
PROCESS_KEY = "process"  # ... and for the leaving process: [host name, pid]
GRACE_S = 2.0       # a nonzero exit: how long the peers get to say they are finishing too
AFTER_PEER_S = 2.0  # not MPI: a rank that saw a peer leave with a nonzero code raises once the
                    # peer is gone (at most this late), so a launcher names the leaving rank
ABORT_FLUSH_S = 0.2  # let the launcher relay our line before MPI Abort tears the pipes down
_POLL_S = 0.001

_get_group: Callable[[], Any] | None = None
_code: int | None = None  # what the script passed to sys.exit/exit/quit, None: not called
_saved: dict[str, Any] = {}
_processes: dict[tuple[int, int], tuple[str, int] | None] = {}  # (group, peer) -> its process


def _status(arg: Any) -> int:
    """Python's exit status for ``sys.exit(arg)``."""
    if arg is None:
        return 0
    if isinstance(arg, int):
        return int(arg)
    return 1  # a message: Python prints it and exits with 1


def _recording(real: Callable[..., Any]) -> Callable[..., Any]:
    def exit(status: Any = None) -> Any:  # noqa: A001 - the same name as what it wraps
        global _code
        _code = _status(status)
        return real(status)
    exit.__doc__ = real.__doc__
    return exit


def install(get_group: Callable[[], Any]) -> None:
    """Watch this process's exit while ``get_group()`` returns an open group (init)."""
    global _get_group, _code
    if _get_group is None:
        atexit.register(_at_exit)
    _get_group, _code = get_group, None
    if not _saved:
        _saved["sys.exit"] = sys.exit
        sys.exit = _recording(sys.exit)
        for name in ("exit", "quit"):
            if hasattr(builtins, name):
                _saved[name] = getattr(builtins, name)
                setattr(builtins, name, _recording(_saved[name]))


def uninstall() -> None:
    """Put ``sys.exit`` back (``destroy_process_group``); the atexit check then finds no group."""
    if "sys.exit" in _saved:
        sys.exit = _saved.pop("sys.exit")
    for name in ("exit", "quit"):
        if name in _saved:
            setattr(builtins, name, _saved.pop(name))


def bye_payload(counts: dict[int, int], exit_code: int | None = None) -> bytes:
    """The SIDE_BYE message: ``{stream: calls}``, plus the exit code of a rank leaving (and
    which process it is: host name and pid)."""
    data: dict[str, Any] = {str(k): v for k, v in counts.items()}
    if exit_code is not None:
        data[EXIT_KEY] = exit_code
        data[PROCESS_KEY] = [socket.gethostname(), os.getpid()]
    return json.dumps(data).encode()


def parse_bye(raw: bytes) -> tuple[dict[int, int], int | None]:
    """``(counts, exit code or None)`` of a SIDE_BYE message."""
    data = json.loads(raw.decode())
    code = data.pop(EXIT_KEY, None)
    data.pop(PROCESS_KEY, None)
    return {int(k): v for k, v in data.items()}, code


def leaving_process(raw: bytes) -> tuple[str, int] | None:
    """``(host name, pid)`` of the rank that sent this SIDE_BYE while leaving, else None."""
    where = json.loads(raw.decode()).get(PROCESS_KEY)
    return (str(where[0]), int(where[1])) if where else None


def _process_alive(where: tuple[str, int] | None) -> bool:
    """Whether a process of this host still exists (a zombie counts: its parent, e.g. the
    launcher, has not collected its exit code yet). False for another host's process."""
    if where is None or where[0] != socket.gethostname():
        return False
    return os.path.exists(f"/proc/{where[1]}")


def peer_exited(group: Any, call: str, peer: int, exit_code: int, calls: int) -> PeerExited:
    """The error of a rank waiting in ``call`` for a peer that left after ``calls`` collectives.

    Not under MPI (where the excepthook's Abort ends the job with ``exit_code``): with a nonzero
    code, first wait until the peer's process is gone (its connection closed), at most
    ``AFTER_PEER_S``, so a launcher that stops the job at the first failed rank names it.
    """
    t = group.transport
    if exit_code and not t.abort_ends_job:
        # gone: its connection closed and, on this host, its process collected by its parent
        where = _processes.get((id(group), peer))
        deadline = time.monotonic() + AFTER_PEER_S
        while ((t.side_channel.peer_lost(peer) is None or _process_alive(where))
               and time.monotonic() < deadline):
            time.sleep(0.01)
    if exit_code == UNKNOWN_EXIT:
        what = (f"rank {peer} left the job after {calls} collective(s) (its script returned or "
                "raised SystemExit; the launcher or mpiexec reports its exit code) while this "
                "rank still waits for it here. Every rank must make the same collectives "
                "and finish together (destroy_process_group on every rank)")
    elif exit_code == 0:
        what = (f"rank {peer} returned normally (exit code 0) after {calls} collective(s) while "
                "this rank still waits for it here. Every rank must make the same collectives "
                "and finish together (destroy_process_group on every rank)")
    else:
        what = (f"rank {peer} exited with code {exit_code} after {calls} collective(s), so it "
                f"will not join this call. Look at rank {peer}'s output for why it left")
    err = PeerExited(f"{group.where(call)}: {what}.", peer, max(exit_code, 0) or 1)
    err.how = f"when rank {peer} left the job"
    err.diagnosis = {"kind": "exited", "rank": peer, "exit_code": exit_code}  # no exchange
    return err


def peer_left(group: Any) -> PeerExited | None:
    """Read the peers' pending goodbyes (SIDE_BYE) into ``group.farewells``; the error to raise
    if one of them left (an exit code) with fewer collectives than this rank has started."""
    t = group.transport
    peer = t.side_channel.pending(SIDE_BYE)
    while peer is not None:
        raw = t.side_channel.try_recv(peer, SIDE_BYE)
        if raw is None:
            break
        group.farewells[peer], code = parse_bye(raw)
        if code is not None:
            group.exit_codes[peer] = code
            _processes[(id(group), peer)] = leaving_process(raw)
        peer = t.side_channel.pending(SIDE_BYE)
    mine = group.ledger.counts()
    for p, code in group.exit_codes.items():
        theirs = group.farewells.get(p, {})
        for stream, n in mine.items():
            if theirs.get(stream, 0) < n:
                last = group.ledger.entries(stream, last=1)
                call = f"{last[0].collective if last else 'collective'} #{n}"
                return peer_exited(group, call, p, code, theirs.get(stream, 0))
    return None


def _at_exit() -> None:
    group = _get_group() if _get_group is not None else None
    if group is None or group.size == 1 or not group.ledger.enabled:
        return
    if getattr(sys, "last_value", None) is not None or group.ledger.failures:
        return  # an uncaught exception or a failed collective: the excepthook ends the job
    leave(group, UNKNOWN_EXIT if _code is None else _code)


def leave(group: Any, code: int) -> None:
    """Tell every peer this rank leaves with ``code``; under MPI with a nonzero code, end the
    job unless every peer finishes too."""
    t = group.transport
    mine = group.ledger.counts()
    peers = [p for p in range(group.size) if p != group.rank]
    for p in peers:
        t.side_channel.send(p, SIDE_BYE, bye_payload(mine, code))
    if code <= 0 or not t.abort_ends_job:
        # 0: an ordinary end (MPI_Finalize waits for the others, as it always did; a rank still
        # waiting for this one in a collective raises PeerExited). Not MPI: exit now; the peers
        # raise once this process is gone, so a launcher names this rank.
        return
    finished: dict[int, dict[int, int]] = dict(group.farewells)  # what the poll hook already read
    gone: set[int] = set()
    grace_s = group.failure_policy.leave_grace_s
    deadline = time.monotonic() + min(grace_s, float(t.timeout_s or DEFAULT_TIMEOUT_S))
    while time.monotonic() < deadline:
        waiting = [p for p in peers if p not in finished and p not in gone]
        if not waiting:
            break
        failed = t.side_channel.pending(SIDE_FAIL)
        if failed is not None:
            gone.add(failed)
        for p in waiting:
            raw = t.side_channel.try_recv(p, SIDE_BYE)
            if raw is not None:
                finished[p] = parse_bye(raw)[0]
            elif t.side_channel.peer_lost(p) is not None:
                gone.add(p)
        time.sleep(_POLL_S)
    still = [p for p in peers if finished.get(p) != mine]
    if not still:
        return  # every rank finished with the same collectives: a collective end
    sys.stderr.write(f"{rank_prefix()} exited with code {code} without destroy_process_group "
                     f"while rank(s) {', '.join(map(str, still))} had not finished; ending the "
                     f"job on all {group.size} ranks with exit code {code}.\n")
    sys.stderr.flush()
    time.sleep(ABORT_FLUSH_S)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)  # MPI's own abort line repeats ours
    t.abort(code)  # MPI: ends every rank (does not return)

