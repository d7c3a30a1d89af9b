"""Real multi-process runs under mpiexec, started from plain pytest with a timeout (dask-mpi style).

Each test launches one job through tests/procs.py ``run_mpi``, which kills the whole process
group on timeout or failure, so no rank outlives its test.
"""


import re

import pytest

from procs import run_mpi

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_all_collectives_under_mpiexec(n):
    result = run_mpi(n, ["tests/launch/collectives_rank.py"], timeout_s=120)
    assert result.returncode == 0, result.report()
    assert f"collectives ok at n={n}" in result.stdout


@pytest.mark.parametrize("where", ["main", "thread"])
def test_one_failing_rank_ends_the_job_quickly(where):
    # Collectives would wait 600 s for the dead rank; the job must end far sooner, through
    # MPI Abort, or run_mpi's 60 s timeout fails the test (no wall-clock assertion needed).
    result = run_mpi(3, ["tests/launch/failing_rank.py", where], timeout_s=60,
                     env={"MINIDIST_TIMEOUT_S": "600"})
    assert result.returncode != 0, result.report()
    assert "[rank 2/3]" in result.stderr and "deliberate failure" in result.stderr, result.report()
    assert "unreachable" not in result.stdout


@pytest.mark.parametrize("algorithm", ["ring", "tree"])
def test_mismatched_shapes_raise_comm_error_naming_the_rank(algorithm):
    result = run_mpi(3, ["tests/watch/mismatch.py", algorithm], timeout_s=60,
                     env={"MINIDIST_DEBUG": "1"})
    assert result.returncode == 0, result.report()
    assert result.stdout.count("rank 1 passed numel=99") == 3, result.report()


@pytest.mark.mpi
def test_ranks_lines_reach_mpiexec_whole_even_unbuffered():
    """print() with several arguments under PYTHONUNBUFFERED: one write per line, so two ranks'
    lines never run together in mpiexec's merged output."""
    code = ("import minidist as md; md.init_process_group(); r = md.get_rank()\n"
            "for i in range(1000): print('LINE', r, i, *'abcdefgh', 'end')\n"
            "md.destroy_process_group()")
    job = run_mpi(2, ["-c", code], timeout_s=90, env={"PYTHONUNBUFFERED": "1"})
    assert job.returncode == 0, job.report()
    lines = [line for line in job.stdout.splitlines() if line]
    assert len(lines) == 2000, job.report()
    bad = [line for line in lines if not re.fullmatch(r"LINE [01] \d+ a b c d e f g h end", line)]
    assert not bad, bad[:5]
