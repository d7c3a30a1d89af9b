"""Mixed precision under real mpiexec (n=2): the bodies are in amp_rank.py, one launch
for every check; rank 0 prints a JSON summary, checked here."""

import json

import pytest
from procs import run_mpi

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def summary(tmp_path_factory):
    job = run_mpi(2, ["tests/ddp/amp_rank.py", tmp_path_factory.mktemp("amp")],
                  timeout_s=180)
    assert job.returncode == 0, job.report()
    res = json.loads(next(l for l in job.stdout.splitlines()
                          if l.startswith("RESULT "))[len("RESULT "):])
    assert res["world_size"] == 2
    return res


def test_loss_scaling_alone_is_bit_exact_and_folds_every_bucket(summary):
    runs = {k: v for k, v in summary.items() if k.startswith("scaler_exact/")}
    assert len(runs) == 8 and all(runs.values()), runs


def test_amp_ranks_end_bit_identical(summary):
    assert summary["amp/identical"]
    assert summary["amp/rel"] < 5e-2  # float16 compute vs float32: close, not equal


def test_inf_on_one_rank_skips_on_every_rank(summary):
    assert summary["inf_one_rank/scale"] == [65536.0, 32768.0, 32768.0]
    assert summary["inf_one_rank/unchanged"] == [False, True, False]   # step 1 was skipped
    assert summary["inf_one_rank/same_scales"] and summary["inf_one_rank/identical"]


def test_comm_hooks_compose_with_amp(summary):
    assert summary["fp16_hook/identical"] and summary["fp16_hook/rel"] < 5e-2
    assert summary["powersgd/identical"] and summary["powersgd/params_finite"]
    assert summary["powersgd/state_finite"]          # the overflow did not poison it
    assert summary["powersgd/scale"][2] < summary["powersgd/scale"][1]


def test_master_weights_under_ddp(summary):
    assert summary["master/bucket_dtypes"] == ["float16"]
    assert summary["master/identical"] and summary["master/rel"] < 5e-2


def test_nonfinite_warning_names_the_rank_once(summary):
    warns = summary["nonfinite/warnings"]
    assert len(warns) == 1 and summary["nonfinite/count"] == 2, warns
    assert "started on rank(s) [1]" in warns[0] and "Warned once" in warns[0]


def test_trainer_amp_resume_is_bit_exact(summary):
    assert summary["resume/bit_identical"] and summary["resume/history_same"]
    assert summary["resume/scaler_same"] and summary["resume/ranks_identical"]
    assert summary["resume/skipped"] > 0 and summary["resume/scaler"]["scale"] < 2.0 ** 20
