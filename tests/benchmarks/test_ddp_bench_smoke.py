"""The DDP scaling benchmark, tiny, under mpiexec -n 2: it runs and writes a sane JSON; with
--trace it writes a merged step timeline that plot_trace.py draws."""

import importlib.util
import json
import subprocess
import sys

import pytest

from procs import REPO, in_a_git_checkout, run_mpi, run_python

BENCH = REPO / "benchmarks" / "ddp_scaling.py"


@pytest.mark.mpi
def test_ddp_scaling_benchmark_tiny(tmp_path):
    res = run_mpi(2, [BENCH, "--quick", "--steps", "2", "--warmup", "1", "--rounds", "1",
                      "--out", tmp_path], timeout_s=90, env={"MINIDIST_TIMEOUT_S": "30"})
    assert res.returncode == 0, res.report()
    data = json.loads((tmp_path / "ddp_scaling_n2.json").read_text())
    rows = {(r["model"], r["ddp"], r.get("overlap")): r for r in data["rows"]}
    assert {("large", False, None), ("large", True, True), ("large", True, False)} <= set(rows)
    plain, ddp = rows[("large", False, None)], rows[("large", True, False)]
    assert all(r["step_ms"] > 0 and r["exposed_comm_ms"] >= 0 for r in data["rows"])
    # DDP's peak memory stays within one extra copy of the 1.86M float32 gradients
    assert ddp["peak_mem_mib"] - plain["peak_mem_mib"] <= 1_863_690 * 4 / 2**20 + 1
    from minidist.ddp import auto_overlap

    assert data["overlap_auto"] is auto_overlap(2)  # what overlap="auto" picks here, recorded
    assert "exposed comm [ms]" in res.stdout and "peak mem [MiB]" in res.stdout


@pytest.mark.mpi
def test_ddp_scaling_trace_and_its_picture(tmp_path):
    res = run_mpi(2, [BENCH, "--quick", "--steps", "2", "--warmup", "1", "--rounds", "1",
                      "--out", tmp_path, "--trace", tmp_path / "tr"], timeout_s=90,
                  env={"MINIDIST_TIMEOUT_S": "30"})
    assert res.returncode == 0, res.report()
    merged = tmp_path / "tr" / "n2" / "trace.json"
    events = json.loads(merged.read_text())["traceEvents"]
    assert {e["pid"] for e in events} == {0, 1}
    png = tmp_path / "step.png"
    plot = subprocess.run([sys.executable, REPO / "benchmarks" / "plot_trace.py", merged,
                           "--out", png], capture_output=True, text=True, timeout=60)
    assert plot.returncode == 0, plot.stderr
    if importlib.util.find_spec("matplotlib") is None:
        assert "matplotlib is not installed" in plot.stdout
    else:
        assert png.stat().st_size > 10_000 and "overlap=on" in plot.stdout


@pytest.mark.mpi
def test_ddp_scaling_bad_flag_is_one_line_once(tmp_path):
    res = run_mpi(2, [BENCH, "--steps", "0", "--out", tmp_path], timeout_s=60)
    assert res.returncode == 2, res.report()
    assert (res.stdout + res.stderr).splitlines() == [
        "ddp_scaling.py: --steps must be >= 1, got 0"], res.report()


@pytest.mark.mpi
def test_plot_trace_draws_the_trace_of_the_readmes_minidist_trace_command(tmp_path):
    """README: ``MINIDIST_TRACE=runs/trace ./mpirun.sh -n 2 python examples/train.py``; the
    folder it fills (trace-rank*.json, and trace.json from the Trainer) is plot_trace's input,
    as is the merged file itself."""
    trace_dir = tmp_path / "trace"
    res = run_mpi(2, [REPO / "examples" / "train.py", "--epochs", "1"], timeout_s=120,
                  env={"MINIDIST_TRACE": str(trace_dir), "MINIDIST_TIMEOUT_S": "60"})
    assert res.returncode == 0, res.report()
    png = tmp_path / "step.png"
    plot = run_python([REPO / "benchmarks" / "plot_trace.py", trace_dir / "trace.json", "--out",
                       png], timeout_s=60)
    assert plot.returncode == 0, plot.report()
    if importlib.util.find_spec("matplotlib") is None:
        assert "matplotlib is not installed" in plot.stdout
    else:
        assert png.stat().st_size > 10_000, plot.report()
        assert "# one training step, n=2 " in plot.stdout and "rank 1:" in plot.stdout
    sys.path.insert(0, str(REPO / "benchmarks"))   # the folder reads as its merged file, and
    try:                                           # as its per-rank files without that file
        from plot_trace import load_events
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    merged = load_events(trace_dir)
    assert merged == load_events(trace_dir / "trace.json")
    (trace_dir / "trace.json").unlink()
    assert sorted(map(str, load_events(trace_dir))) == sorted(map(str, merged))


@pytest.mark.mpi
def test_ddp_scaling_benchmark_amp_rows(tmp_path):
    res = run_mpi(2, [BENCH, "--quick", "--amp", "--steps", "2", "--warmup", "1", "--rounds", "1",
                      "--out", tmp_path], timeout_s=90, env={"MINIDIST_TIMEOUT_S": "30"})
    assert res.returncode == 0, res.report()
    data = json.loads((tmp_path / "ddp_scaling_amp_n2.json").read_text())
    modes = {(r["model"], r.get("amp")) for r in data["rows"]}
    assert {("large", "scaler"), ("large", "autocast"), ("small", "scaler")} <= modes
    assert data["fused_unscale_ms_1.86M"] > 0
    assert "amp=scaler adds" in res.stdout and "fused unscale of a 1.86M-float" in res.stdout


@pytest.mark.mpi
def test_ddp_scaling_times_the_averaging_hooks_on_one_model(tmp_path):
    res = run_large_model(tmp_path, "--hooks", "2")
    assert res.returncode == 0, res.report()
    (block,) = json.loads((tmp_path / "ddp_scaling_n2.json").read_text())["hooks"]
    names = [name.split()[0] for name in block["hooks"]]
    assert names == ["avg_allreduce_hook", "prescaled_allreduce_hook", "allreduce_hook"]
    default = block["hooks"][next(iter(block["hooks"]))]
    assert default["over_default_ms"] == 0 and all(h["ms"] > 0 for h in block["hooks"].values())
    assert "its comm hook changed every step (2 rounds)" in res.stdout


@pytest.mark.mpi
def test_ddp_scaling_paired_steps_and_the_floor_without_overlap(tmp_path):
    res = run_large_model(tmp_path, "--paired", "4")
    assert res.returncode == 0, res.report()
    (pair,) = json.loads((tmp_path / "ddp_scaling_n2.json").read_text())["paired"]
    assert pair["plain_ms"] > 0 and pair["ddp_ms"] > 0 and pair["ratio"] > 0
    assert pair["allreduce_ms"] > 0 and pair["finite_check_ms"] > 0
    assert pair["allreduce_in_step_ms"] > 0  # the DDP side's exposed communication
    want = 1 + (pair["allreduce_ms"] + pair["finite_check_ms"]) / pair["plain_ms"]
    assert abs(pair["floor_ratio"] - want) < 1e-9
    assert "can be no faster than (plain + both) / plain" in res.stdout
    # the reduction's loop alone on private arrays: the floor's floor, with the check kept
    assert pair["private_loop_ms"] > 0
    want = 1 + (pair["private_loop_ms"] + pair["finite_check_ms"]) / pair["plain_ms"]
    assert abs(pair["private_floor_ratio"] - want) < 1e-9
    assert "the reduction's loop alone, on private arrays" in res.stdout


def run_large_model(tmp_path, *extra):
    """The benchmark on the large model only, tiny, under mpiexec -n 2, with ``extra`` options."""
    return run_mpi(2, [BENCH, "--quick", "--models", "large", "--steps", "2", "--warmup", "1",
                       "--rounds", "1", *extra, "--out", tmp_path], timeout_s=90,
                   env={"MINIDIST_TIMEOUT_S": "30"})


AB = REPO / "benchmarks" / "ddp_overhead_ab.py"


@pytest.mark.mpi
def test_ddp_overhead_ab_runs_the_old_commit_from_its_own_copy(tmp_path):
    if not in_a_git_checkout():
        pytest.skip("needs a git checkout (the old side is exported with git archive)")
    res = run_python([AB, "--old", "HEAD", "--rounds", "2", "--pairs", "1", "--warmup", "0",
                      "--out", tmp_path], timeout_s=120, env={"MINIDIST_TIMEOUT_S": "30"})
    assert res.returncode == 0, res.report()
    data = json.loads((tmp_path / "ddp_overhead_ab.json").read_text())
    assert [r["first"] for r in data["rounds"]] == ["old", "new"]  # the order flips
    for r in data["rounds"]:
        assert r["new"]["minidist"] == str(REPO)  # this checkout
        assert r["old"]["minidist"] != str(REPO)  # the exported commit, not the editable install
        assert all(r[s]["plain_ms"] > 0 and r[s]["ratio"] > 0 for s in ("old", "new"))
    assert "median ratio: old" in res.stdout


def test_ddp_overhead_ab_names_a_bad_commit_in_one_line(tmp_path):
    if not in_a_git_checkout():
        pytest.skip("needs a git checkout")
    res = run_python([AB, "--old", "no-such-commit", "--out", tmp_path], timeout_s=30)
    assert res.returncode == 1, res.report()
    assert "--old 'no-such-commit' is not a commit of this repository" in res.stderr
    assert "Traceback" not in res.stderr
