"""The fused-optimizer benchmark at a tiny size: it runs, checks its results, writes its JSON."""

import json
import subprocess
import sys

from procs import REPO, job_env

BENCH = REPO / "benchmarks" / "fused_optim.py"


def test_fused_optim_benchmark_tiny(tmp_path):
    res = subprocess.run([sys.executable, str(BENCH), "--numel", "20k", "--layers", "2",
                          "--repeats", "2", "--check-steps", "3", "--out", str(tmp_path),
                          "--no-torch"],
                         env=job_env(), cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    data = json.loads((tmp_path / "fused_optim.json").read_text())
    assert data["tensors"] == 4 and 19_000 < data["numel"] < 21_000 and data["torch"] is None
    assert {r["impl"] for r in data["rows"]} == {"default", "fused", "fused-per-tensor"}
    assert data["check"]["fused_bits_equal_default"] is True
    assert data["check"]["fused-per-tensor_bits_equal_default"] is True
    calls = {r["impl"]: r["kernel_calls"] for r in data["rows"]}
    assert calls["fused"] == 1 and calls["fused-per-tensor"] == 4  # one call vs one per tensor
    for r in data["rows"]:
        assert r["samples"] == 2 and r["median_ms"] > 0 and r["vs_best_torch"] is None
    assert "vs best torch" in res.stdout


def test_gpu_training_benchmark_exits_cleanly_without_a_gpu(tmp_path):
    from minidist import xp as backend

    if backend.gpu_available():  # pragma: no cover - a GPU machine runs the real thing
        import pytest
        pytest.skip("a GPU is here: the benchmark would measure")
    res = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_training.py"),
                          "--out", str(tmp_path)], env=job_env(), cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip().count("\n") == 0 and "no CUDA GPU here" in res.stdout
    assert not list(tmp_path.iterdir())


def test_train_step_phases_tiny(tmp_path):
    res = subprocess.run([sys.executable, str(BENCH), "--train-step", "--repeats", "1", "--out",
                          str(tmp_path)], env=job_env(), cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    data = json.loads((tmp_path / "train_step.json").read_text())
    assert [r["phase"] for r in data["rows"]] == ["forward", "forward+backward", "AdamW",
                                                  "AdamW fused"]
    assert all(r["median_us"] > 0 and r["samples"] == 60 for r in data["rows"])


def test_gpu_training_step_section_runs_on_the_cpu(tmp_path):
    """The step section's code, run on the CPU (--cpu-dry-run), so the GPU run does not meet
    it for the first time."""
    res = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_training.py"),
                          "--cpu-dry-run", "--models", "small", "--repeats", "1", "--no-torch",
                          "--out", str(tmp_path)], env=job_env(), cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    data = json.loads((tmp_path / "gpu_training.json").read_text())
    (row,) = data["sections"]["step"]["rows"]
    assert data["dry_run_cpu"] is True and row["model"] == "small"
    for key in ("forward_ms", "fwd_bwd_ms", "opt_ms", "opt_fused_ms", "amp_step_ms"):
        assert row[f"minidist_{key}"] > 0
