"""Shared-memory all-reduces in flight at once cannot corrupt each other (rank body:
tests/fastpath/shm_concurrent_rank.py): two groups in two threads, DDP's comm thread beside a user
thread on another group, and two streams of one group (only stream 0 uses the window)."""

import json

import pytest

from procs import run_mpi


@pytest.mark.mpi
@pytest.mark.parametrize("n", [3])
def test_two_shm_collectives_in_flight(n):
    job = run_mpi(n, ["tests/fastpath/shm_concurrent_rank.py"], timeout_s=120,
                  env={"MINIDIST_SHM_CHUNK_BYTES": str(1 << 20)})  # the chunked path too
    assert job.returncode == 0, job.report()
    rows = json.loads(next(line for line in job.stdout.splitlines()
                           if line.startswith("RESULT "))[len("RESULT "):])
    for row in rows:
        assert row["has_shm"] == [True, True]
        assert row["two_groups"] == [] and row["ddp_user_thread"] == [] \
            and row["two_streams"] == [], row
        assert row["ddp_close"] and row["ddp_identical"]
        assert "shm" not in row["stream1_algorithms"] and row["stream1_algorithms"]
        assert "serves stream 0 only" in row["shm_tag1"]
