"""benchmarks/gpu_check.py without a GPU: one line and status 0; its --cpu smoke run writes the
JSON and the tables; the targets are judged right on made-up GPU numbers."""

import importlib.util
import json
import subprocess
import sys

import pytest

from procs import REPO, job_env

from minidist import xp as backend

SCRIPT = REPO / "benchmarks" / "gpu_check.py"


def load():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(backend.gpu_available(), reason="this machine has a GPU")
def test_without_a_gpu_it_says_so_in_one_line(tmp_path):
    res = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "gc")],
                         cwd=REPO, env=job_env(), capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    lines = [x for x in (res.stdout + res.stderr).splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("gpu_check: no GPU to check here"), lines
    assert not (tmp_path / "gc").exists()


def test_cpu_smoke_run_writes_json_and_tables(tmp_path):
    res = subprocess.run([sys.executable, str(SCRIPT), "--cpu", "--no-torch", "--sizes",
                          "1024,4099", "--out", str(tmp_path)], cwd=REPO, env=job_env(),
                         capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert result["env"]["status"] == "ok" and result["env"]["implementation"] == "numba-cpu"
    for name in ("gpu_tests", "examples", "mpi"):
        assert result[name]["status"] == "skipped: --cpu"
    rows = result["kernels"]["rows"]
    assert {(r["case"], r["impl"]) for r in rows} == {
        ("copy", "device copy"),
        *((c, i) for c in ("fp32_inplace", "fp16_to_master", "master_to_model")
          for i in ("fused", "numpy"))}
    assert {r["n"] for r in rows} == {1024, 4099}
    for r in rows:
        assert r["host_us"] > 0 and r["gpu_us"] > 0 and r["GBps"] > 0
        assert r["exact"] in (None, True), r
        assert ("copy_share" in r) == (r["case"] != "copy")
    ipc = result["gpu_allreduce"]  # gpu_allreduce.py --cpu: cuda_ipc's protocol, host windows
    assert ipc["status"] == "ok" and len(ipc["rows"]) == 4 and ipc["targets"] == [], ipc
    training = result["gpu_training"]  # the step section of gpu_training.py, on the CPU
    assert training["status"] == "ok" and [r["model"] for r in training["step_rows"]] == ["small"]
    steps = result["train_step"]["rows"]
    assert [(r["model"], r["mode"]) for r in steps] == [("small", "fp32"), ("small", "amp"),
                                                        ("gemm", "fp32"), ("gemm", "amp")]
    for r in steps:  # the counts are the device's: no host sync but the scaler's, ...
        assert r["host_syncs"] == (1 if r["mode"] == "amp" else 0), r["host_sync_ops"]
        assert r["weight_casts"] == (r["params"] if r["mode"] == "amp" else 0)
        assert r["opt_launches"] == 1 and r["python_calls"] > 0
    verdict = {t["target"]: t["pass"] for t in result["targets"]}
    for target in ("no host sync in an fp32 step, one (the scaler's) in an AMP step",
                   "an AMP step casts each weight at most once",
                   "a fused optimizer step is one launch per (device, dtype)"):
        assert verdict[target] is True, result["targets"]
    md = (tmp_path / "gpu_check.md").read_text()
    assert "| fp16_to_master | 4099 | fused |" in md and "minidist ms/step" in md
    assert "host syncs | Python calls | weight casts | fused opt launches |" in md
    assert md == load().markdown(result)


def fake_rows(fused_host=8.0, share=0.95, torch_us=200.0, cupy_factor=1.5):
    rows = []
    for n in (1 << 10, 1 << 16, 1 << 24, 1 << 26):
        copy_us = 8 * n / 3.8e6
        rows.append({"case": "copy", "impl": "device copy", "n": n, "host_us": 5.0,
                     "gpu_us": copy_us, "GBps": 8 * n / (copy_us * 1e3)})
        for case, nbytes in (("fp32_inplace", 8), ("fp16_to_master", 6),
                             ("master_to_model", 6)):
            us = nbytes * n / (3.8e6 * share)
            for impl, t in (("fused", us), ("cupy", us * cupy_factor),
                            ("torch", torch_us if n == 1 << 26 else us)):
                rows.append({"case": case, "impl": impl, "n": n, "host_us": fused_host,
                             "gpu_us": t, "GBps": nbytes * n / (t * 1e3),
                             "copy_share": (nbytes * n / (t * 1e3)) / 3800.0})
    return rows


def test_targets_are_judged_from_the_rows():
    gc = load()
    ok = {"kernels": {"rows": fake_rows()},
          "gpu_tests": {"status": "ok", "counts": {"passed": 14}}}
    verdict = {t["target"]: t["pass"] for t in gc.targets(ok)}
    assert len(verdict) == 5 and all(verdict.values()), verdict
    bad = {"kernels": {"rows": fake_rows(fused_host=30.0, share=0.7, torch_us=1.0,
                                         cupy_factor=0.9)},
           "gpu_tests": {"status": "failed", "counts": {"passed": 3, "failed": 2}}}
    verdict = {t["target"]: t["pass"] for t in gc.targets(bad)}
    assert len(verdict) == 5 and not any(verdict.values()), verdict
    md = gc.markdown({**ok, "targets": gc.targets(ok)})
    assert "| host time <= 15 us per call (persistent buffers) | yes | max 8.0 us" in md
    assert gc.targets({}) == []


def test_gpu_training_targets_from_made_up_rows():
    gc = load()

    def training(staged, ipc, step, amp, opt):
        return {"gpu_training": {
            "allreduce_rows": [{"bytes": 16 << 20, "staged_shm_ms": staged, "staged_ring_ms": 9,
                                "host_shm_ms": 2, "host_ring_ms": 3, "cuda_ipc_ms": ipc,
                                "device_copy_ms": 0.01, "d2h_ms": 0.3, "h2d_ms": 0.3,
                                "staged_vs_bound": staged / (1.3 * 2 + 0.6),
                                "cuda_ipc_vs_staged": ipc / staged}],
            "step_rows": [{"model": m, "widths": [1, 2], "minidist_fwd_bwd_ms": 1.0,
                           "minidist_opt_ms": 1.0, "minidist_opt_fused_ms": 0.5,
                           "minidist_amp_step_ms": 2.0, "step_vs_torch": step,
                           "amp_step_vs_torch": amp, "opt_vs_torch": opt}
                          for m in ("wide", "deep")]}}
    good = {t["target"]: t["pass"] for t in gc.targets(training(3.0, 1.0, 1.1, 1.2, 1.0))}
    assert len(good) == 8 and all(good.values()), good
    bad = {t["target"]: t["pass"] for t in gc.targets(training(5.0, 4.0, 2.0, 2.0, 2.0))}
    assert len(bad) == 8 and not any(bad.values()), bad
    assert "| 16 | 3.00 | 2.00 | 1.00 |" in gc.markdown(training(3.0, 1.0, 1.1, 1.2, 1.0))
