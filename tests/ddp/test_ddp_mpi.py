"""DDP under real mpiexec at n = 1, 2, 4: one launch per size runs every check of
ddp_rank.py and rank 0 prints a JSON summary, checked here.

What is checked (see the rank script for the bodies): parameters bit-identical on every rank
after DDP steps; DDP with batch B per rank == one process with batch n*B (float64, rtol=atol=
1e-10: only the summation order differs) for SGD and AdamW, with and without no_sync
accumulation, for every all-reduce algorithm; overlap on/off give the same bits;
find_unused_parameters; mismatched models -> clear error on every rank; fp16 and PowerSGD
hooks; NaN detection; comm-thread errors reach the main thread; state_dict keys.
"""

import json

import pytest

from procs import run_mpi

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module", params=[1, 2, 4])
def summary(request):
    n = request.param
    job = run_mpi(n, ["tests/ddp/ddp_rank.py"], timeout_s=120)
    assert job.returncode == 0, job.report()
    line = next(l for l in job.stdout.splitlines() if l.startswith("RESULT "))
    res = json.loads(line[len("RESULT "):])
    assert res["world_size"] == n
    return res


def test_matches_single_process_big_batch_and_ranks_agree(summary):
    runs = {k: v for k, v in summary.items() if k.count("/") == 2}
    algos = {k.split("/")[2] for k in runs}
    assert {"auto", "ring", "tree", "rd", "direct"} <= algos
    if summary["world_size"] > 1:
        assert "mpi" in algos
    bad = {k: v for k, v in runs.items() if not (v["identical"] and v["close"])}
    assert not bad, bad
    assert {"sgd/micro2/ring", "adamw/micro2/ring"} <= set(runs)  # no_sync accumulation


def test_overlap_and_bucket_size_do_not_change_the_result(summary):
    assert summary["overlap_off_same_bits"]
    assert summary["tiny_buckets_close"]


def test_find_unused_parameters(summary):
    assert summary["unused/close"] and summary["unused/grad_zero"]
    msg = summary["unused/error"]
    assert "'unused'" in msg and "find_unused_parameters=True" in msg


def test_mismatched_models_give_a_clear_error(summary):
    if summary["world_size"] == 1:
        pytest.skip("needs two ranks")
    msg, n = summary["mismatch_error"], summary["world_size"]
    assert "pre-flight check failed: parameter #0 'w1' (6, 10) float64 on rank" in msg, msg
    assert f"'w1' (6, 11) float64 on rank {n - 1}." in msg, msg


def test_comm_hooks(summary):
    assert summary["fp16/identical"] and summary["fp16/rel"] < 1e-2
    assert summary["powersgd/full_rank_exact"]
    assert summary["powersgd/rank1_identical"] and summary["powersgd/rank1_loss_drops"]


def test_errors_name_what_went_wrong(summary):
    assert "non-finite" in summary["nan_error"] and "'w1'" in summary["nan_error"]
    assert "bucket 0" in summary["hook_error"] and "wire cut" in summary["hook_error"]


def test_wrapper_api(summary):
    assert summary["state_dict_keys"] == ["module.w1", "module.b1", "module.w2", "module.b2"]
    assert summary["grads_are_views"]
