"""benchmarks/tensor_wrap.py at toy size: it checks out the old tree, runs the main job from both
trees in turn, and writes its table and JSON (the timing itself is not checked)."""

import json

import pytest

from procs import REPO, run_python


@pytest.mark.mpi
def test_tensor_wrap_benchmark_runs_both_trees(tmp_path):
    job = run_python([REPO / "benchmarks" / "tensor_wrap.py", "--old", "HEAD", "--rounds", "1",
                      "--world", "2", "--epochs", "1", "--out", tmp_path], timeout_s=300)
    assert job.returncode == 0, job.report()
    assert "median of per-round new/old" in job.stdout, job.report()
    data = json.loads((tmp_path / "tensor_wrap.json").read_text())
    assert len(data["ratios"]) == 1 and data["median_ratio"] > 0
    same = data["runs"]["old"][0]["test_acc"] == data["runs"]["new"][0]["test_acc"]
    assert same, data    # HEAD against itself: the same seed trains to the same accuracy
