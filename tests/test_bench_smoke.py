"""The all-reduce benchmark at a tiny size under mpiexec: it runs, checks, and writes its JSON."""

import json
import subprocess
import sys

import pytest

from procs import REPO, job_env, run_mpi

BENCH = REPO / "benchmarks" / "allreduce.py"


@pytest.mark.mpi
def test_allreduce_benchmark_tiny(tmp_path):
    res = run_mpi(2, [BENCH, "--min-bytes", "8", "--max-bytes", "2K", "--step", "16",
                      "--iters", "3", "--warmup", "1", "--out", tmp_path, "--no-plot"],
                  timeout_s=60, env={"MINIDIST_TIMEOUT_S": "20"})
    assert res.returncode == 0, res.report()
    data = json.loads((tmp_path / "allreduce_n2.json").read_text())
    assert data["n"] == 2 and data["machine"]["cores"] >= 1
    algos = {r["algorithm"] for r in data["rows"]}
    assert {"ring", "tree", "rd", "direct", "mpi", "auto", "shm", "shm_zc"} <= algos
    assert sorted({r["nbytes"] for r in data["rows"]}) == [8, 128, 2048]
    assert all(r["wrong"] == 0 and r["identical"] for r in data["rows"]), res.stdout
    assert all(r["ratio_to_mpi"] > 0 for r in data["rows"])
    assert "busbw(GB/s)" in res.stdout and "#wrong" in res.stdout

    # --fit reads that JSON and writes constants select.load_model() accepts.
    fit_out = tmp_path / "fit.json"
    fit = subprocess.run([sys.executable, str(BENCH), "--fit", str(tmp_path / "allreduce_n2.json"),
                          "--fit-out", str(fit_out)], env=job_env(), cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert fit.returncode == 0, fit.stderr
    from minidist.comm.algorithms import select

    model = json.loads(fit_out.read_text())
    assert "ring" in model["model"] and model["model"]["ring"]["alpha_us"] > 0
    saved = {"model": {k: dict(v) for k, v in select.MODEL.items()},
             "rules": {k: [list(step) for step in rule] for k, rule in select.RULES.items()},
             "candidates": list(select.CANDIDATES)}
    try:
        select.load_model(fit_out)
    finally:  # the rest of this pytest process must see the shipped tuning again
        if saved["rules"]:
            select.load_model(saved)
        else:
            select.load_model({k: v for k, v in saved.items() if k != "rules"})
            select.RULES.clear()


def test_allreduce_benchmark_over_tcp_beside_gloo(tmp_path):
    """--backend tcp under the launcher; torch gloo beside it when torch is importable, else one
    printed line and no gloo rows."""
    import importlib.util

    argv = [sys.executable, "-m", "minidist.launch", "--standalone", "--nproc-per-node", "2",
            str(BENCH), "--backend", "tcp", "--algorithms", "rd,auto", "--max-bytes", "64",
            "--step", "8", "--iters", "3", "--warmup", "1", "--out", str(tmp_path),
            "--no-plot"]
    res = subprocess.run(argv, env=job_env({"MINIDIST_TIMEOUT_S": "20"}), cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rows = json.loads((tmp_path / "allreduce_tcp_1x2.json").read_text())["rows"]
    assert all(r["wrong"] == 0 and r["identical"] for r in rows), res.stdout
    gloo = [r for r in rows if r["algorithm"] == "gloo"]
    if importlib.util.find_spec("torch") is None:
        assert not gloo and "torch is not installed: no gloo column" in res.stdout, res.stdout
    else:
        assert len(gloo) == 2 and all(r["ratio_to_gloo"] > 0 for r in rows), rows


@pytest.mark.mpi
def test_allreduce_benchmark_compares_only_what_it_measured(tmp_path):
    """No ring-vs-tree verdict when tree was not among the algorithms measured."""
    res = run_mpi(2, [BENCH, "--min-bytes", "8", "--max-bytes", "128", "--step", "16",
                      "--iters", "2", "--warmup", "1", "--out", tmp_path, "--no-plot",
                      "--algorithms", "ring,mpi"], timeout_s=60, env={"MINIDIST_TIMEOUT_S": "20"})
    assert res.returncode == 0, res.report()
    assert "than tree" not in res.stdout, res.stdout
