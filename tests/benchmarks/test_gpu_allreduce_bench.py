"""benchmarks/gpu_allreduce.py (the device all-reduce at the copy bound) without a GPU: one line
and status 0; its CPU twin (cuda_ipc's protocol on host windows, two MPI ranks) writes every
row; the targets are judged right on made-up GPU rows (the same checks gpu_check makes)."""

import importlib.util
import json
import subprocess
import sys

import pytest

from procs import REPO, job_env, run_mpi

from minidist import xp as backend

SCRIPT = REPO / "benchmarks" / "gpu_allreduce.py"


def load():
    sys.path.insert(0, str(REPO / "benchmarks"))
    spec = importlib.util.spec_from_file_location("gpu_allreduce", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(backend.gpu_available(), reason="this machine has a GPU")
def test_without_a_gpu_it_says_so_in_one_line():
    res = subprocess.run([sys.executable, str(SCRIPT)], cwd=REPO, env=job_env(),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    lines = [x for x in (res.stdout + res.stderr).splitlines() if x.strip()]
    assert len(lines) == 1 and "no CUDA GPU here" in lines[0], lines


@pytest.mark.mpi
def test_cpu_twin_writes_every_row(tmp_path):
    res = run_mpi(2, [SCRIPT, "--cpu", "--repeats", "2", "--out", tmp_path], timeout_s=180)
    assert res.returncode == 0, res.report()
    data = json.loads((tmp_path / "gpu_allreduce.json").read_text())
    assert [r["bytes"] for r in data["rows"]] == [4, 4096, 65536, 1 << 20]
    for r in data["rows"]:
        assert r["cuda_ipc_us"] > 0 and r["host_us"] > 0 and r["auto_algorithm"]
    (ddp,) = data["ddp_rows"]
    assert ddp["cuda_ipc_ms"] > 0 and ddp["staged_ms"] > 0 and ddp["one_rank_ms"] > 0
    assert data["targets"] == []  # a CPU run judges no GPU target


def rows(ipc_small, ipc_big_ratio, auto_ratio):
    out = []
    for b in (4, 4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20):
        copy = max(b / 4e6, 1.0)
        out.append({"bytes": b, "cuda_ipc_us": ipc_small if b <= 4096 else copy * ipc_big_ratio,
                    "copy_us": copy, "cuda_ipc_vs_copy": ipc_big_ratio, "auto_vs_bound":
                    auto_ratio, "auto_algorithm": "host_copy"})
    return out


def test_targets_from_made_up_gpu_rows():
    ga = load()
    ddp = [{"model": "wide", "cuda_ipc_vs_one_rank": 1.1}]
    good = {t["target"]: t["pass"] for t in ga.targets(rows(40.0, 1.5, 0.9), ddp)}
    assert len(good) == 6 and all(good.values()), good
    ddp = [{"model": "wide", "cuda_ipc_vs_one_rank": 1.5}]
    bad = {t["target"]: t["pass"] for t in ga.targets(rows(900.0, 3.0, 1.4), ddp)}
    assert len(bad) == 6 and not any(bad.values()), bad
    import gpu_check  # benchmarks/ is on the path (load)

    made_up = [dict(r, host_copy_us=None, auto_us=1.0, host_us=1.0, d2h_us=0.0, h2d_us=0.0)
               for r in rows(40.0, 1.5, 0.9)]
    md = "\n".join(gpu_check.allreduce_markdown({"gpu_allreduce": {"rows": made_up}}))
    assert "| 4 | 40.0 | - | 1.0 (host_copy) |" in md
