"""Ctrl-C ends a multi-rank job: once, promptly, one line, exit code 130, no rank left alive.

A terminal sends SIGINT to its foreground process group, which is mpiexec's (Hydra starts the
ranks in sessions of their own and forwards the signal to them). The test does the same: it
starts mpiexec in a new session, waits until every rank reports READY, and signals that group.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from procs import REPO, job_env, mpiexec_path, readline_within, run_mpi

pytestmark = pytest.mark.mpi

SCRIPT = REPO / "tests" / "watch" / "interrupted_rank.py"
N = 2


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"   # a zombie has ended
    except (FileNotFoundError, ProcessLookupError):
        return False


def _sigint_live() -> None:
    """In the child before exec: SIGINT back to its default, as in a terminal. A suite started
    in the background (``cmd &`` in a script) runs with SIGINT ignored, and an ignored signal
    stays ignored across exec, so the ranks would never see the Ctrl-C this file sends."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _kill_all(job: subprocess.Popen, pids: list[int]) -> None:
    for target in [job.pid, *pids]:   # mpiexec's group, then each rank's own session
        try:
            os.killpg(target, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


@pytest.mark.parametrize("mode", ["train", "blocked"])
def test_ctrl_c_ends_the_job_with_one_line_and_exit_code_130(mode):
    argv = [mpiexec_path(), "-n", str(N), sys.executable, str(SCRIPT), mode]
    job = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=job_env({"MINIDIST_TIMEOUT_S": "600"}), cwd=str(REPO),
                           start_new_session=True)
    out: list[str] = []
    err: list[str] = []
    readers = [threading.Thread(target=lambda: out.extend(iter(lambda: job.stdout.read(1), "")),
                                daemon=True),
               threading.Thread(target=lambda: err.append(job.stderr.read()), daemon=True)]
    for r in readers:
        r.start()
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 90
        while len(pids) < N and time.monotonic() < deadline and job.poll() is None:
            time.sleep(0.05)   # mpiexec merges the ranks' output: lines may interleave
            pids = [int(p) for p in re.findall(r"READY rank=\d+ pid=(\d+)\.", "".join(out))]
        assert len(pids) == N, f"ranks did not start: exit {job.poll()}: {''.join(out)}{err}"
        os.killpg(job.pid, signal.SIGINT)            # what Ctrl-C in a terminal does
        try:
            job.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("the job was still running 60 s after Ctrl-C")
        for r in readers:
            r.join(10)
        stdout, stderr = "".join(out), "".join(err)
        assert job.returncode == 130, f"exit {job.returncode}\n{stderr}"
        lines = [ln for ln in stderr.splitlines() if "interrupted (SIGINT)" in ln]
        assert 1 <= len(lines) <= N, stderr
        assert re.fullmatch(rf"\[rank \d/{N}\] interrupted \(SIGINT\): ending the job on "
                            rf"all {N} ranks with exit code 130\.", lines[0]), stderr
        assert "Traceback" not in stderr and "BAD TERMINATION" not in stderr, stderr
        assert "unreachable" not in stdout
        for pid in pids:                              # Hydra ends the ranks it started
            for _ in range(100):
                if not _alive(pid):
                    break
                time.sleep(0.1)
            assert not _alive(pid), f"rank process {pid} outlived the job"
    finally:
        _kill_all(job, pids)
        job.wait()


@pytest.mark.parametrize("mode", ["train", "stuck"])
def test_ctrl_c_over_tcp_ends_every_rank_with_exit_code_130(mode, port):
    """torchrun-style ranks: the terminal signals each process; each exits with 130. "stuck":
    each rank takes the KeyboardInterrupt and hangs in its handler; the SIGINT watcher ends it
    INTERRUPT_UNWIND_S later."""
    procs = []
    try:
        for r in range(N):
            env = job_env({"RANK": str(r), "WORLD_SIZE": str(N), "LOCAL_RANK": str(r),
                           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
            procs.append(subprocess.Popen([sys.executable, str(SCRIPT), mode], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True, cwd=str(REPO), start_new_session=True,
                                          preexec_fn=_sigint_live))
        for p in procs:   # each prints READY once it trains
            assert "READY" in readline_within(p.stdout, 90), f"rank exit {p.poll()}"
        for p in procs:
            p.send_signal(signal.SIGINT)
        for p in procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pytest.fail("a rank was still running 60 s after Ctrl-C")
        errs = [p.stderr.read() for p in procs]
        assert [p.returncode for p in procs] == [130] * N, errs
        for r, err in enumerate(errs):
            assert f"[rank {r}/{N}] interrupted (SIGINT)" in err and "Traceback" not in err, err
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def test_destroy_process_group_restores_python_sigint_handling():
    job = run_mpi(N, [SCRIPT, "restore"], timeout_s=60)
    assert job.returncode == 0, job.report()
    assert job.stdout.count("restored on rank") == N, job.report()
