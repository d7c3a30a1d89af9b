"""MPI jobs leave no MPICH shared-memory file (/dev/shm/mpich_shm_*) on the exit paths minidist
controls: a clean end, an uncaught exception, a rank leaving with a code, Ctrl-C. Before, each
aborted run left one ~2 MB file per node (52 -> 55 files over a raise, a sys.exit(3) and a
Ctrl-C). Each rank prints the files it maps; after the job none of them may exist.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from procs import REPO, job_env, mpiexec_path, run_mpi

pytestmark = pytest.mark.mpi
BODY = REPO / "tests" / "fastpath" / "shm_files_rank.py"


def _files(stdout: str) -> set[str]:
    found = set()
    for line in stdout.splitlines():
        if line.startswith("SHM "):
            found.update(p for p in line.split()[3:] if p.startswith("/dev/shm/"))
    return found


@pytest.mark.parametrize("mode,code", [("clean", 0), ("raise", 1), ("exit3", 3)])
def test_no_mpich_file_outlives_the_job(mode, code):
    job = run_mpi(2, [BODY, mode], timeout_s=90)
    assert job.returncode == code, job.report()
    files = _files(job.stdout)
    assert files, job.report()  # MPICH maps one per node
    assert not [f for f in files if Path(f).exists()], job.report()


def test_no_mpich_file_outlives_a_ctrl_c():
    job = subprocess.Popen([mpiexec_path(), "-n", "2", sys.executable, str(BODY), "wait"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=job_env(), cwd=str(REPO), start_new_session=True,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        lines = [job.stdout.readline() for _ in range(2)]
        assert all(ln.startswith("SHM ") for ln in lines), lines
        time.sleep(0.5)
        os.killpg(job.pid, signal.SIGINT)
        job.wait(timeout=60)
        assert job.returncode == 130, job.stderr.read()
        files = _files("".join(lines))
        assert files and not [f for f in files if Path(f).exists()], files
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
        job.wait()


def test_mpirun_sh_says_what_ended_a_job_it_stopped():
    """SIGTERM to mpirun.sh and MINIDIST_JOB_TIMEOUT_S end with a minidist line (before: only
    MPICH's BAD TERMINATION banner), and the killed ranks' files are removed."""
    job = subprocess.run([str(REPO / "mpirun.sh"), "-n", "2", "python", str(BODY), "wait"],
                         capture_output=True, text=True, timeout=120, cwd=str(REPO),
                         env=job_env({"MINIDIST_JOB_TIMEOUT_S": "8"}))
    assert job.returncode == 124, job.stderr
    assert re.search(r"mpirun.sh: the job ran longer than MINIDIST_JOB_TIMEOUT_S=8 s: stopped "
                     r"every rank \(exit code 124\)", job.stderr), job.stderr
    files = _files(job.stdout)
    assert files and not [f for f in files if Path(f).exists()], (files, job.stderr)


def test_sigterm_to_mpirun_sh_is_named():
    job = subprocess.Popen([str(REPO / "mpirun.sh"), "-n", "2", "python", str(BODY), "wait"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=job_env(), cwd=str(REPO), start_new_session=True)
    try:
        lines = [job.stdout.readline() for _ in range(2)]
        assert all(ln.startswith("SHM ") for ln in lines), lines
        os.killpg(job.pid, signal.SIGTERM)  # what `kill -TERM -<pgid>` or a scheduler does
        job.wait(timeout=60)
        err = job.stderr.read()
        assert job.returncode == 143, err
        assert "mpirun.sh: received SIGTERM: stopped every rank of the job (exit code 143)." \
            in err, err
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
        job.wait()


def _start_waiting_job() -> tuple[subprocess.Popen, dict[int, int], set[str]]:
    """./mpirun.sh -n 2 ... wait: the job, {rank: pid} and the files its ranks map."""
    job = subprocess.Popen([str(REPO / "mpirun.sh"), "-n", "2", "python", str(BODY), "wait"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=job_env(), cwd=str(REPO), start_new_session=True)
    lines = [job.stdout.readline() for _ in range(2)]
    assert all(ln.startswith("SHM ") for ln in lines), lines
    pids = {int(ln.split()[1]): int(ln.split()[2][4:]) for ln in lines}
    time.sleep(1.5)  # the watchdog has looked at the ranks (it does every 0.5 s)
    return job, pids, _files("".join(lines))


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _end(job: subprocess.Popen, pids: dict[int, int]) -> None:
    if job.poll() is None:
        os.killpg(job.pid, signal.SIGKILL)
    for pid in pids.values():  # never leave a rank behind, whatever the test found
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    job.wait()


def test_kill_9_of_mpirun_sh_takes_its_job_with_it():
    """kill -9 cannot be trapped: the watchdog outside the script ends mpiexec and the ranks
    (before: they ran on, still alive 15 s later) and removes their shared-memory files."""
    job, pids, files = _start_waiting_job()
    try:
        os.kill(job.pid, signal.SIGKILL)  # the script only: not its process group
        job.wait(timeout=10)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(map(_alive, pids.values())):
            time.sleep(0.1)
        assert not [p for p in pids.values() if _alive(p)], pids
        _, err = job.communicate(timeout=30)  # the watchdog's line, then every pipe closes
        assert f"mpirun.sh (PID {job.pid}) was killed: stopped every rank" in err, err
        assert files and not [f for f in files if Path(f).exists()], files
    finally:
        _end(job, pids)


def test_a_rank_killed_from_outside_is_named_by_its_rank():
    """kill -9 of rank 1 a few seconds after start: one mpirun.sh line names rank 1 and its
    PID (MPICH's banner names only the PID), and its new shared-memory file is removed."""
    job, pids, files = _start_waiting_job()
    try:
        os.kill(pids[1], signal.SIGKILL)
        _, err = job.communicate(timeout=60)
        assert job.returncode != 0, err
        assert f"mpirun.sh: rank 1 (PID {pids[1]}) ended the job" in err, err
        assert files and not [f for f in files if Path(f).exists()], (files, err)
    finally:
        _end(job, pids)
