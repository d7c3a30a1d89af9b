"""DDP broadcast_buffers=True keeps BatchNorm running statistics identical across ranks, with
torch's rule for when (rank body: buffers_rank.py)."""

import json

import pytest

from procs import run_mpi

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def res():
    job = run_mpi(2, ["tests/ddp/buffers_rank.py"], timeout_s=90)
    assert job.returncode == 0, job.report()
    return json.loads(next(l for l in job.stdout.splitlines()
                           if l.startswith("RESULT "))[len("RESULT "):])


def torch_rule(kinds):
    """torch 2.13's DistributedDataParallel: ``_pre_forward`` syncs buffers when
    ``require_forward_param_sync`` (True at construction), and ``_post_forward`` sets it to
    ``is_grad_enabled() and require_backward_grad_sync`` (False for no_grad and no_sync)."""
    flag, out = True, []
    for kind in kinds:
        out.append(int(flag))
        flag = kind == "synced"
    return out


def test_forwards_broadcast_buffers_exactly_when_torchs_would(res):
    kinds = ["synced", "no_sync", "no_grad", "no_grad", "synced", "synced", "no_grad"]
    assert res["pattern"] == torch_rule(kinds) == [1, 1, 0, 0, 0, 1, 1]


def test_first_eval_forward_after_training_uses_rank0_statistics(res):
    ev = res["eval"]
    assert ev["stats_differed_after_training"], ev
    assert ev["eval_outputs_identical"], ev
    assert ev["first_eval_broadcasts"] == 2 and ev["second_eval_broadcasts"] == 0, ev


def test_broadcast_buffers_keeps_running_stats_identical(res):
    # each step: one no_sync forward + one synced forward update the statistics (eval: none)
    assert res["on"]["tracked"] == res["off"]["tracked"]
    assert res["on"]["identical"], res
    assert not res["off"]["identical"], res
