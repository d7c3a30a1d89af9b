"""Pre-flight check under real mpiexec (n=2 and 3): one rank differs -> every rank stops
before step 0 with the same readable diff naming the field and the ranks. Bodies in
preflight_rank.py; rank 0 prints a JSON summary."""

import json

import pytest

from procs import run_mpi

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module", params=[2, 3])
def summary(request):
    n = request.param
    job = run_mpi(n, ["tests/ddp/preflight_rank.py"], timeout_s=120)
    assert job.returncode == 0, job.report()
    res = json.loads(next(l for l in job.stdout.splitlines()
                          if l.startswith("RESULT "))[len("RESULT "):])
    assert res["world_size"] == n
    return res


def same_error_on_every_rank(msgs):
    n = len(msgs)
    assert all(m for m in msgs), msgs  # every rank raised
    bodies = {m.split("] ", 1)[1] for m in msgs}  # drop the "[rank r/N]" prefix
    assert len(bodies) == 1, msgs
    assert [m.split("]")[0] for m in msgs] == [f"[rank {r}/{n}" for r in range(n)]
    return bodies.pop()


def test_a_different_model_stops_every_rank(summary):
    n = summary["world_size"]
    msg = same_error_on_every_rank(summary["model"])
    others = "rank 0" if n == 2 else "ranks 0, 1"
    assert msg.startswith("DistributedDataParallel: pre-flight check failed: parameter #0 "
                          f"'0.weight' (16, 8) float32 on {others} but '0.weight' (17, 8) "
                          f"float32 on rank {n - 1}"), msg
    assert "bucket #" not in msg  # implied by the parameters: not reported
    assert "Every rank must build the same model" in msg


def test_a_different_batch_count_stops_every_rank_before_step_0(summary):
    n = summary["world_size"]
    msg = same_error_on_every_rank(summary["batches"])
    assert msg.startswith("Trainer.fit: pre-flight check failed: dataset length"), msg
    assert "batches per epoch" in msg and f"on rank {n - 1}" in msg, msg
    assert "Pass the same full dataset on every rank" in msg
    assert summary["steps_run"] == [0] * n


def test_a_different_library_version_stops_every_rank(summary):
    n = summary["world_size"]
    msg = same_error_on_every_rank(summary["version"])
    others = "rank 0" if n == 2 else "ranks 0, 1"
    assert ("pre-flight check failed: minidist version 0.1.0 on "
            f"{others} but 9.9.9 on rank {n - 1}. Install the same minidist") in msg, msg


def test_identical_runs_pass(summary):
    assert summary["same"] == [""] * summary["world_size"]
