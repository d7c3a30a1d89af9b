"""Trainer under mpiexec (n=2, 4): exact resume, exact distributed evaluation, refused
checkpoints. The bodies are in trainer_rank.py; rank 0 prints a JSON summary."""

import json

import pytest

from procs import run_mpi

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("n", [2, 4])
def test_trainer_resume_and_evaluate(n, tmp_path):
    job = run_mpi(n, ["tests/ddp/trainer_rank.py", tmp_path], timeout_s=120)
    assert job.returncode == 0, job.report()
    res = json.loads(next(l for l in job.stdout.splitlines()
                          if l.startswith("RESULT "))[len("RESULT "):])
    assert res["world_size"] == n
    assert res["resume_start_epoch"] == 2
    assert res["resume_bit_identical"] and res["resume_history_same"]
    assert res["ranks_identical"]
    loss, acc, ref_loss, ref_acc = res["eval"]
    # float64 sums over ranks vs one float32 mean: equal to float32 precision; the accuracy
    # is a count ratio and must be exact (padding never counted twice).
    assert acc == ref_acc
    assert loss == pytest.approx(ref_loss, rel=1e-6)
    assert "'0.weight' has shape (16, 8) in the checkpoint but (17, 8)" in res["wrong_model_error"]
    assert res["nothing_overwritten"]
    msg = res["dataset_mismatch_error"]
    assert "Trainer.fit: pre-flight check failed: dataset length" in msg, msg
    assert "batches per epoch" in msg and f"on rank {n - 1}" in msg, msg
    assert "same full dataset on every rank" in msg
