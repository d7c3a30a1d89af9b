"""benchmarks/bucket_alignment.py at toy size: it runs, prints its table and writes its JSON;
a bad flag is one line."""

import json
import subprocess
import sys

from procs import REPO

BENCH = REPO / "benchmarks" / "bucket_alignment.py"


def test_bucket_alignment_tiny(tmp_path):
    res = subprocess.run([sys.executable, str(BENCH), "--rows", "32", "--cols", "48",
                          "--rounds", "2", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=120, cwd=REPO)
    assert res.returncode == 0, res.stderr
    data = json.loads((tmp_path / "bucket_alignment.json").read_text())
    assert [r["offset_bytes"] for r in data["rows"]] == [0, 16, 40]
    assert data["rows"][0]["product_ratio"] == 1.0 and data["rows"][0]["step_ratio"] == 1.0
    assert all(r["product_ms"] > 0 and r["step_ms"] > 0 for r in data["rows"])
    assert "x aligned" in res.stdout and data["shape"] == [32, 48]


def test_bucket_alignment_bad_flag_is_one_line():
    res = subprocess.run([sys.executable, str(BENCH), "--rounds", "0"],
                         capture_output=True, text=True, timeout=60, cwd=REPO)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
