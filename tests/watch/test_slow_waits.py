"""A long silent wait says once, early, whom it waits for and how long it may still last.

Before: a rank waiting in the rendezvous for ranks that never start, or in a collective behind
a hung peer, printed nothing until MINIDIST_TIMEOUT_S (300 s by default) had passed. Now one
warning comes after the failure policy's wait_notice_s (5 s), naming who and the time left.
The jobs here use a 60 s timeout and are ended (SIGKILL) once the line is seen.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from procs import REPO, free_port, job_env

SCRIPT = REPO / "tests" / "watch" / "interrupted_rank.py"


def _first_warning(procs: list, which: int, limit_s: float = 40.0) -> str:
    """Read rank ``which``'s stderr until the waiting line comes (bounded)."""
    p = procs[which]
    deadline = time.monotonic() + limit_s
    seen = []
    fd = p.stderr.fileno()
    os.set_blocking(fd, False)
    while time.monotonic() < deadline and p.poll() is None:
        try:
            chunk = os.read(fd, 65536).decode(errors="replace")
        except BlockingIOError:
            chunk = ""
        if chunk:
            seen.append(chunk)
            text = "".join(seen)
            hit = [ln for ln in text.splitlines() if "waiting" in ln and "for" in ln]
            if hit:
                return hit[0]
        time.sleep(0.1)
    pytest.fail(f"no waiting line within {limit_s:.0f} s: {''.join(seen)!r}")


def _start(ranks: list, n: int, mode: list) -> list:
    port = free_port()
    return [subprocess.Popen(
        [sys.executable, str(SCRIPT), *mode], cwd=str(REPO), text=True,
        env=job_env({"RANK": str(r), "WORLD_SIZE": str(n), "MASTER_ADDR": "127.0.0.1",
                     "MASTER_PORT": str(port), "MINIDIST_TIMEOUT_S": "60"}),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True) for r in ranks]


def _kill(procs: list) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def test_rank_0_waiting_for_ranks_that_never_start_says_whom():
    procs = _start([0], 3, ["rendezvous"])
    try:
        line = _first_warning(procs, 0)
        assert re.search(r"rendezvous: waiting \d+ s for the other ranks \(ranks \[1, 2\] did "
                         r"not register with rank 0 yet\); the wait ends after "
                         r"MINIDIST_TIMEOUT_S=60 s \(\d+ s more\)", line), line
    finally:
        _kill(procs)


def test_a_rank_waiting_for_rank_0_says_so():
    procs = _start([1], 2, ["rendezvous"])
    try:
        line = _first_warning(procs, 0)
        assert "rendezvous: waiting" in line and "to accept a connection" in line, line
        assert "MINIDIST_TIMEOUT_S=60 s" in line, line
    finally:
        _kill(procs)


@pytest.mark.parametrize("wait", ["all_reduce", "barrier"])
def test_a_collective_behind_a_hung_peer_names_it(wait):
    procs = _start([0, 1], 2, ["hung", wait])
    try:
        line = _first_warning(procs, 0)
        assert re.search(r"\[rank 0/2\] WARNING .*: \w+ #\d+: waiting \d+ s for (rank 1|the "
                         r"other ranks)", line), line
        assert "MINIDIST_TIMEOUT_S=60 s" in line and "Ctrl-C ends the job now" in line, line
    finally:
        _kill(procs)
