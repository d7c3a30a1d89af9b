"""The launcher names the rank that failed first, from what the ranks report, and quotes its error.

Rank 1 of 3 fails at step 5; ranks 0 and 2 wait for it in an all-reduce. Whatever order the
processes exit in, the launcher names rank 1, quotes its exception line, returns its code, and
stops ranks 0 and 2 before they repeat the news (no ERROR line or traceback from them): the
output is as short as mpiexec's.
"""

from __future__ import annotations

import pytest

from procs import REPO, run_python

BODY = REPO / "tests" / "launch" / "first_failure_rank.py"


def _run(mode: str):
    return run_python(["-m", "minidist.launch", "--standalone", "--nproc-per-node", "3", BODY,
                       mode], timeout_s=90, env={"MINIDIST_TIMEOUT_S": "60"})


@pytest.mark.parametrize("attempt", range(2))
def test_the_rank_that_raised_is_named_with_its_exception_line(attempt):
    job = _run("raise")
    assert job.returncode == 1, job.report()
    assert ("[minidist.launch] rank 1 exited with code 1; stopped the other ranks. Rank 1 raised: "
            "'RuntimeError: rank one broke at step 5'") in job.stderr, job.report()
    assert "[rank 0]" not in job.stderr and "[rank 2]" not in job.stderr, job.report()
    assert len(job.stderr.strip().splitlines()) <= 8, job.report()


def test_a_rank_that_vanished_is_named_with_its_code():
    job = _run("os_exit")
    assert job.returncode == 3, job.report()
    assert ("[minidist.launch] rank 1 exited with code 3; stopped the other ranks. Rank 1 printed "
            "nothing.") in job.stderr, job.report()
    assert "[rank 0]" not in job.stderr and "[rank 2]" not in job.stderr, job.report()
