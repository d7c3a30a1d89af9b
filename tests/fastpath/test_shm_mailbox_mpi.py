"""The small shared-memory all-reduce through per-rank mailboxes (rank body:
tests/fastpath/mailbox_rank.py): exact results around its size limit, interleaved with MPI's
Allreduce and the larger paths, and a mismatch with MPI's Allreduce found at once."""

import json

import pytest

from procs import run_mpi


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
def test_mailbox_all_reduce(n):
    job = run_mpi(n, ["tests/fastpath/mailbox_rank.py"], timeout_s=120,
                  env={"MINIDIST_TIMEOUT_S": "30"})
    assert job.returncode == 0, job.report()
    lines = job.stdout.splitlines()
    rows = json.loads(next(x for x in lines if x.startswith("RESULT "))[len("RESULT "):])
    assert len({row["digest"] for row in rows}) == 1, rows
    for row in rows:
        assert row["wrong"] == [], row
        assert {"shm", "mpi"} <= set(row["algorithms"]), row
    found = [json.loads(x[len("MISMATCH "):]) for x in lines if x.startswith("MISMATCH ")]
    assert sorted(f["rank"] for f in found) == list(range(n)), job.report()
    for f in found:
        assert f["error"] is not None and "called different collectives" in f["error"], f
        assert f["s"] < 15, f  # found in the guard line, not by the 30 s deadline
