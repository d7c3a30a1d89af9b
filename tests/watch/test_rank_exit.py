"""A rank that leaves through Python's exit while the others still wait ends the job at once,
names itself and its exit code, and the job exits with that code; a job whose ranks all finish
(with or without destroy_process_group) ends cleanly. Under mpiexec and under the launcher.

The bound: MINIDIST_TIMEOUT_S is 120 s and each job gets 60 s, so a job that waited for the
timeout (the old behaviour: rank 1 sat in MPI_Finalize) fails here as a timeout.
"""

import pytest

from procs import REPO, run_mpi, run_python

BODY = REPO / "tests" / "watch" / "leaving_rank.py"
ENV = {"MINIDIST_TIMEOUT_S": "120"}


def run(launcher, *args, n=2):
    if launcher == "mpiexec":
        return run_mpi(n, [BODY, *args], timeout_s=60, env=ENV)
    return run_python(["-m", "minidist.launch", "--standalone", "--nproc-per-node", str(n),
                       BODY, *args], timeout_s=60, env=ENV)


@pytest.mark.mpi
@pytest.mark.parametrize("launcher", ["mpiexec", "launch"])
@pytest.mark.parametrize("n", [2, 3])
def test_rank_exiting_with_a_code_mid_job_ends_the_job_with_that_code(launcher, n):
    job = run(launcher, "mid", "3", n=n)
    assert job.returncode == 3, job.report()
    err = job.stderr
    # Under mpiexec the waiting ranks say why they stop (the first one's MPI Abort may end the
    # others before they print); the launcher stops them (SIGTERM) as soon as rank 1 has
    # exited, and names rank 1 itself, so there they may not get to say it.
    said = [r for r in range(n) if f"[rank {r}/{n}] all_reduce #2: rank 1 exited with code 3 "
            "after 1 collective(s), so it will not join this call." in err]
    if launcher == "mpiexec":
        assert said, job.report()
    assert "did not answer" not in err and "CommTimeout" not in err, job.report()
    assert "Traceback (most recent call last)" not in err, err  # the short form: no chain
    if launcher == "launch":
        assert "[minidist.launch] rank 1 exited with code 3" in err, job.report()


@pytest.mark.mpi
@pytest.mark.parametrize("launcher", ["mpiexec", "launch"])
def test_rank_returning_normally_mid_job_is_named_as_such(launcher):
    job = run(launcher, "mid", "0")
    assert job.returncode == 1, job.report()
    assert ("[rank 0/2] all_reduce #2: rank 1 left the job after 1 collective(s) (its script "
            "returned or raised SystemExit; the launcher or mpiexec reports its exit code) while "
            "this rank still waits for it here." in job.stderr
            or launcher == "launch"), job.report()  # the launcher may stop rank 0 first
    assert "exit code 0" not in job.stderr, job.report()  # a code rank 1 could not read
    assert "CommTimeout" not in job.stderr, job.report()
    if launcher == "launch":
        assert ("[minidist.launch] rank 1 exited with code 0; stopped the other ranks."
                in job.stderr), job.report()


def test_raise_system_exit_under_the_launcher_ends_the_job_with_its_code():
    """``raise SystemExit(3)`` is ``sys.exit(3)`` for Python, but its code is not visible inside
    the process: the launcher, which sees the real status, names rank 1 and returns 3."""
    job = run("launch", "mid", "raise3", n=3)
    assert job.returncode == 3, job.report()
    assert "[minidist.launch] rank 1 exited with code 3; stopped the other ranks." in job.stderr
    assert "exit code 0" not in job.stderr and "Traceback" not in job.stderr, job.report()


@pytest.mark.mpi
@pytest.mark.parametrize("launcher", ["mpiexec", "launch"])
@pytest.mark.parametrize("how,code", [("plain", 0), ("destroy", 0), ("late", 0), ("exit3", 3)])
def test_a_collective_end_stays_clean(launcher, how, code):
    job = run(launcher, "end", how)
    assert job.returncode == code, job.report()
    assert job.stdout.count("finished: 4") == 2, job.report()
    if launcher == "mpiexec" or code == 0:  # the launcher says which rank failed first
        assert job.stderr.strip() == "", job.report()
