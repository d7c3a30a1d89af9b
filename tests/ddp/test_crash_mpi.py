"""A crash on one rank mid-step ends the whole job, names the rank, and keeps the last checkpoint."""

import pytest
from procs import REPO, run_mpi

from minidist.checkpoint import latest_checkpoint, load_checkpoint

SCRIPT = REPO / "tests" / "ddp" / "crash_rank.py"


@pytest.mark.mpi
def test_crash_on_one_rank_ends_the_job_and_the_last_checkpoint_survives(tmp_path):
    # Rank 0 would wait 600 s in its next collective; the job must end through MPI Abort long
    # before, or run_mpi's 120 s timeout fails the test.
    crashed = run_mpi(2, [SCRIPT, tmp_path, "--crash-in-epoch", "3"], timeout_s=120,
                      env={"MINIDIST_TIMEOUT_S": "600"})
    # The whole job ended (rank 0 was not left waiting in a collective), non-zero, rank named.
    assert crashed.returncode != 0, crashed.report()
    assert "[rank 1/2]" in crashed.stderr and "injected failure on rank 1 in epoch 3" in \
        crashed.stderr, crashed.report()
    # The checkpoints written before the crash are complete and loadable; no temp files remain.
    last = latest_checkpoint(tmp_path)
    assert last is not None and last.name == "checkpoint-000002.npz", \
        sorted(p.name for p in tmp_path.iterdir())
    load_checkpoint(last)
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]
    # And the run can be finished from there.
    resumed = run_mpi(2, [SCRIPT, tmp_path, "--resume"], timeout_s=120)
    assert resumed.returncode == 0, resumed.report()
    assert "FINISHED start_epoch=2" in resumed.stdout, resumed.report()
