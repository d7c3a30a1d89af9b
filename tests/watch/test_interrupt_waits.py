"""Ctrl-C ends a rank promptly wherever it waits: the rendezvous, a collective, a barrier.

Over TCP, under the launcher and under mpiexec, a rank waiting for a peer that never comes
takes SIGINT at once, prints the one documented line (no traceback) and exits with 130, long
before MINIDIST_TIMEOUT_S (60 s here; every job is bounded well below it). Ranks started in the
background of a script inherit an ignored SIGINT (``cmd &`` without job control): they are
interrupted too, instead of outliving the Ctrl-C that ended the rest of their job.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from procs import REPO, free_port, job_env, mpiexec_path

SCRIPT = REPO / "tests" / "watch" / "interrupted_rank.py"
ENV = {"MINIDIST_TIMEOUT_S": "60"}
BOUND_S = 20.0  # far below the timeout: a rank that waited it out fails here
LINE = re.compile(r"\[rank (\d)/(\d)\] interrupted \(SIGINT\): ending the job on all \d ranks "
                  r"with exit code 130\.")


def _sigint(how: str):
    """preexec_fn: the rank's SIGINT as a terminal's foreground job has it, or ignored."""
    disposition = signal.SIG_DFL if how == "default" else signal.SIG_IGN
    return lambda: signal.signal(signal.SIGINT, disposition)


def _start(argv: list, env: dict, how: str = "default") -> subprocess.Popen:
    return subprocess.Popen(argv, env=job_env({**ENV, **env}), cwd=str(REPO),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=_sigint(how))


def _wait_ready(procs: list) -> None:
    for p in procs:
        line = p.stdout.readline()
        assert "READY" in line, (line, p.stderr.read() if p.poll() is not None else "")


def _interrupt_and_wait(procs: list, group_of=None) -> tuple[list, list, float]:
    time.sleep(1.0)  # let each rank get into its wait
    t0 = time.monotonic()
    for p in procs:
        os.killpg(group_of or p.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        if group_of:
            break
    for p in procs:
        try:
            p.wait(timeout=BOUND_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"a rank was still waiting {BOUND_S:.0f} s after Ctrl-C")
    took = time.monotonic() - t0
    return [p.returncode for p in procs], [p.stderr.read() for p in procs], took


def _cleanup(procs: list) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        p.wait()


def _tcp_env(rank: int, n: int, port: int) -> dict:
    return {"RANK": str(rank), "WORLD_SIZE": str(n), "LOCAL_RANK": str(rank),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "MINIDIST_RUN_ID": f"interrupt-{port}"}


@pytest.mark.parametrize("rank", [0, 1])
def test_ctrl_c_in_the_tcp_rendezvous_prints_one_line_and_exits_130(rank):
    """One rank of two started; the other never comes. Before: a KeyboardInterrupt traceback
    (rank 0, out of the rendezvous' select) or the full timeout (SIGINT ignored)."""
    port = free_port()
    procs = [_start([sys.executable, SCRIPT, "rendezvous"], _tcp_env(rank, 2, port))]
    try:
        _wait_ready(procs)
        codes, errs, _ = _interrupt_and_wait(procs)
        assert codes == [130], errs
        assert LINE.fullmatch(errs[0].strip()), errs  # the one line, nothing else
    finally:
        _cleanup(procs)


@pytest.mark.parametrize("how", ["default", "ignored"])
@pytest.mark.parametrize("wait", ["all_reduce", "barrier"])
def test_ctrl_c_in_a_tcp_collective_behind_a_hung_peer_ends_every_rank(wait, how):
    """Rank 1 sleeps, rank 0 waits for it. ``ignored``: both started as ``cmd &`` in a script
    would start them (SIGINT ignored); before, they went on waiting until the timeout."""
    port, n = free_port(), 2
    procs = [_start([sys.executable, SCRIPT, "hung", wait], _tcp_env(r, n, port), how)
             for r in range(n)]
    try:
        _wait_ready(procs)
        codes, errs, took = _interrupt_and_wait(procs)
        assert codes == [130] * n, errs
        for r, err in enumerate(errs):
            lines = err.strip().splitlines()
            assert len(lines) == 1 and LINE.fullmatch(lines[0]), err
            assert lines[0].startswith(f"[rank {r}/{n}]"), err
    finally:
        _cleanup(procs)


def test_ctrl_c_under_the_launcher_during_the_rendezvous_is_one_line():
    """The launcher's node 1 never comes; Ctrl-C to the launcher's group. Before: a
    KeyboardInterrupt traceback from every rank, then the launcher's line."""
    argv = [sys.executable, "-m", "minidist.launch", "--nnodes", "2", "--nproc-per-node", "2",
            "--master-port", str(free_port()), "--rdzv-id", "interrupt", SCRIPT, "rendezvous"]
    job = _start(argv, {"MINIDIST_AUTH_TOKEN": "s3cret"})  # no notice about sharing one
    try:
        for _ in range(2):
            assert "READY" in job.stdout.readline()
        codes, errs, _ = _interrupt_and_wait([job], group_of=job.pid)
        assert codes == [130], errs
        assert errs[0].strip() == ("[minidist.launch] received SIGINT: stopped all 2 ranks of "
                                   "this node."), errs
    finally:
        _cleanup([job])


@pytest.mark.mpi
@pytest.mark.parametrize("wait", ["all_reduce", "barrier"])
def test_ctrl_c_under_mpiexec_behind_a_hung_peer_is_one_line(wait):
    job = _start([mpiexec_path(), "-n", "2", sys.executable, SCRIPT, "hung", wait], {})
    try:
        for _ in range(2):
            assert "READY" in job.stdout.readline()
        codes, errs, _ = _interrupt_and_wait([job], group_of=job.pid)
        assert codes == [130], errs
        mine = [ln for ln in errs[0].splitlines() if not ln.startswith("[mpiexec@")]
        assert len(mine) == 1 and LINE.fullmatch(mine[0]), errs
    finally:
        _cleanup([job])
