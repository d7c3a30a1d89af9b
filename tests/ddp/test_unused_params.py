"""A parameter unused on ONE rank is caught at the end of the same backward and ends the job,
under mpiexec (MPI Abort from the excepthook) and over TCP (closed sockets).

Without the end-of-backward check, rank 1 would apply a gradient that was never averaged and,
at the last step, save and exit 0 while rank 0 waited in the all-reduce of the bucket rank 1
never launched.
"""

import pytest
from procs import REPO, run_env_ranks, run_mpi

SCRIPT = REPO / "tests" / "ddp" / "unused_rank.py"


@pytest.mark.mpi
@pytest.mark.parametrize("overlap", [True, False])
def test_layer_skipped_on_one_rank_ends_the_job_naming_the_parameter(tmp_path, overlap):
    # Rank 0 would wait 600 s in the all-reduce; the job must end through MPI Abort long
    # before, or run_mpi's timeout fails the test.
    job = run_mpi(2, [SCRIPT, tmp_path, "--steps", "4", "--skip-at", "3"]
                  + (["--overlap"] if overlap else []),
                  timeout_s=120, env={"MINIDIST_TIMEOUT_S": "600"})
    assert job.returncode != 0, job.report()
    err = job.stderr
    assert "[rank 1/2] DistributedDataParallel: backward of step 3" in err, job.report()
    assert "'mid.weight'" in err and "'mid.bias'" in err, job.report()
    assert "find_unused_parameters=True" in err, job.report()
    assert "SAVED" not in job.stdout, job.report()
    assert not (tmp_path / "model.npz").exists()


def test_over_tcp_the_peer_sees_the_closed_connection(tmp_path):
    # TCP: the excepthook closes rank 1's sockets; rank 0's all-reduce fails at once, naming
    # rank 1, instead of waiting out the 600 s deadline.
    job = run_env_ranks(2, [SCRIPT, tmp_path, "--overlap"], timeout_s=120,
                        env={"MINIDIST_TIMEOUT_S": "600"})
    assert job.returncode != 0, job.report()
    assert "[rank 1/2] DistributedDataParallel: backward of step 3" in job.stderr, job.report()
    assert "connection to rank 1 lost" in job.stderr, job.report()
    assert "SAVED" not in job.stdout and not (tmp_path / "model.npz").exists()
