"""benchmarks/cluster_allreduce.py at one tiny size and one rate: it builds the nodes, measures,
predicts, and writes its JSON (the published numbers are in docs/scaling.md)."""

from __future__ import annotations

import json
import sys

import pytest
from procs import REPO, job_env

from minidist.testing.cluster import unavailable_reason

REASON = unavailable_reason()
pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120),
              pytest.mark.skipif(REASON is not None,
                                 reason=f"minidist.testing.cluster {REASON}")]


def test_cluster_allreduce_tiny(tmp_path):
    import subprocess

    res = subprocess.run([sys.executable, "benchmarks/cluster_allreduce.py", "--rates", "1gbit",
                          "--min-bytes", "256K", "--max-bytes", "256K", "--iters", "3",
                          "--out", str(tmp_path), "--timeout", "90"],
                         capture_output=True, text=True, timeout=110, cwd=REPO, env=job_env())
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    data = json.loads((tmp_path / "cluster_allreduce.json").read_text())
    (row,) = data["rates"]["1gbit"]["rows"]
    assert row["nbytes"] == 256 << 10 and row["auto_chose"] == "hier"
    assert set(row["measured_us"]) == set(row["model_us"]) == {"ring", "rd", "hier"}
    run = data["rates"]["1gbit"]["run"]
    assert run["nodes"] == 2 and all(r["wrong"] == 0 for r in run["rows"])
    assert all(s["sent_bytes"] > 256 << 10 for s in run["links"]), run["links"]
    assert "| 256 KiB |" in data["tables"][0]
