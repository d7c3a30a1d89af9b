"""The AMP kernel benchmark at a tiny size: it runs, checks its results, writes its JSON."""

import json
import subprocess
import sys

from procs import REPO, job_env

BENCH = REPO / "benchmarks" / "amp_kernels.py"


def test_amp_kernels_benchmark_tiny(tmp_path):
    res = subprocess.run([sys.executable, str(BENCH), "--numel", "4099", "--threads", "1",
                          "--repeats", "2", "--warmup", "1", "--out", str(tmp_path),
                          "--no-plot", "--no-gpu", "--no-torch"],
                         env=job_env(), cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    data = json.loads((tmp_path / "amp_kernels.json").read_text())
    assert data["numel"] == 4099 and data["machine"]["cores"] >= 1
    rows = data["rows"]
    cases = {"fp32_inplace", "fp16_to_master", "master_to_model"}
    assert {r["case"] for r in rows} == cases
    for case in cases:
        impls = {r["impl"] for r in rows if r["case"] == case}
        assert impls == {"fused", "numpy"}
    for r in rows:
        assert r["exact"] is True, r
        assert r["threads"] == 1 and r["samples"] == 2 and r["median_us"] > 0
        assert r["bytes"] == {"fp32_inplace": 8, "fp16_to_master": 6,
                              "master_to_model": 6}[r["case"]] * 4099
        assert r["GBps"] > 0 and r["speedup_vs_numpy"] > 0
    assert "GB/s" in res.stdout and "vs numpy" in res.stdout
