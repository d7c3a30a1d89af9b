"""A rank that skips a training step fails at its next bucket, on every rank, before a wrong
average reaches any parameter; legitimate differences between ranks are not taken for one
(rank body: skipped_step_rank.py; the labels: minidist/watch/step_labels.py)."""

import json

import pytest

from procs import run_mpi, run_python

pytestmark = pytest.mark.mpi


def results(job):
    assert job.returncode == 0, job.report()
    out = [json.loads(line[len("RESULT "):]) for line in job.stdout.splitlines()
           if line.startswith("RESULT ")]
    assert sorted(r["rank"] for r in out) == [0, 1], job.report()
    return out


@pytest.mark.parametrize("case", ["after_forward", "before_forward"])
def test_a_skipped_step_fails_at_the_next_bucket(case):
    out = results(run_mpi(2, ["tests/ddp/skipped_step_rank.py", case], timeout_s=90,
                          env={"MINIDIST_TIMEOUT_S": "30"}))
    for r in out:
        assert r["steps"] == 5, r  # batches 0-4; the next bucket fails on both ranks
        assert "CollectiveMismatch" in r["error"] and "failed at step 5" in r["error"], r
        assert "epoch 0 batch 5" in r["error"] and "epoch 0 batch 6" in r["error"], r
    assert out[0]["params"] == out[1]["params"]  # no wrong average was applied anywhere


def test_what_is_not_a_skip_passes():
    out = results(run_mpi(2, ["tests/ddp/skipped_step_rank.py", "clean"], timeout_s=90,
                          env={"MINIDIST_TIMEOUT_S": "30"}))
    assert all(r["error"] is None for r in out), out
    assert out[0]["params"] == out[1]["params"]


@pytest.mark.parametrize("case", ["after_forward", "clean"])
def test_thread_ranks_label_their_own_steps(case):
    out = results(run_python(["tests/ddp/skipped_step_rank.py", "--threads", "2", case],
                             timeout_s=90, env={"MINIDIST_TIMEOUT_S": "30"}))
    if case == "clean":
        assert all(r["error"] is None for r in out), out
    else:
        assert all("epoch 0 batch 6" in r["error"] and r["steps"] == 5 for r in out), out
    assert out[0]["params"] == out[1]["params"]
