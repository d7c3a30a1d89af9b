"""``python -m minidist.tune``: a real 2-rank calibration writes the cache, a second job uses
it (and says so in the debug log); corrupt and mismatched cache files are ignored with one
warning. Rank body: tests/auto/tune_rank.py."""

import json

import pytest

from procs import REPO, run_mpi, run_python


def results(job) -> list[dict]:
    # mpiexec may join two ranks' lines into one: decode each "RESULT {...}" where it starts.
    decoder = json.JSONDecoder()
    rows = [decoder.raw_decode(part)[0] for part in job.stdout.split("RESULT ")[1:]]
    return sorted(rows, key=lambda r: r["rank"])


def warned(job) -> list[str]:
    return [line for line in job.stderr.splitlines()
            if "WARNING" in line and "ignoring the calibration file" in line]


@pytest.mark.mpi
def test_tune_writes_a_cache_that_the_next_job_uses_and_bad_files_are_ignored(tmp_path):
    env = {"MINIDIST_CACHE_DIR": str(tmp_path), "MINIDIST_DEBUG": "1"}
    job = run_mpi(2, ["-m", "minidist.tune", "--max-bytes", "8192"], timeout_s=90,
                  env={"MINIDIST_CACHE_DIR": str(tmp_path)})
    assert job.returncode == 0, job.report()
    files = list(tmp_path.glob("allreduce-*-mpi-n2.json"))
    assert len(files) == 1, job.report()
    data = json.loads(files[0].read_text())
    assert data["key"]["transport"] == "mpi" and data["key"]["world_size"] == 2
    assert set(data["rules"]) == {"2", "2s"} and "mpi" in data["model"]
    assert "wrote" in job.stdout and str(files[0]) in job.stdout

    used = run_mpi(2, ["tests/auto/tune_rank.py"], timeout_s=60, env=env)
    assert used.returncode == 0, used.report()
    for r in results(used):
        assert r["source"] == f"calibration {files[0]}" == r["table_source"]
        assert r["reason"].startswith("calibrated") and r["ledger_reason"] == r["reason"]
        assert r["sum"] == 3.0
    assert f"auto uses the calibration {files[0]}" in used.stderr

    files[0].write_text('{"format": 1, "key": ')  # corrupt: cut off
    corrupt = run_mpi(2, ["tests/auto/tune_rank.py"], timeout_s=60, env=env)
    assert corrupt.returncode == 0, corrupt.report()
    assert all(r["source"].startswith("shipped") and r["sum"] == 3.0 for r in results(corrupt))
    warnings = warned(corrupt)
    assert len(warnings) == 1 and str(files[0]) in warnings[0], corrupt.stderr
    assert "not valid JSON" in warnings[0] and "python -m minidist.tune" in warnings[0]
    assert "auto uses the shipped table" in corrupt.stderr

    data["key"]["version"] = "0.0.1"  # made by another minidist version
    files[0].write_text(json.dumps(data))
    other = run_mpi(2, ["tests/auto/tune_rank.py"], timeout_s=60, env=env)
    assert other.returncode == 0, other.report()
    assert all(r["source"].startswith("shipped") for r in results(other))
    warnings = warned(other)
    assert len(warnings) == 1 and "version='0.0.1'" in warnings[0], other.stderr


@pytest.mark.mpi
def test_tune_over_tcp_under_the_launcher(tmp_path):
    job = run_python(["-m", "minidist.launch", "--standalone", "--nproc-per-node", "2", "-m",
                      "minidist.tune", "--max-bytes", "2048"], timeout_s=90,
                     env={"MINIDIST_CACHE_DIR": str(tmp_path)})
    assert job.returncode == 0, job.report()
    files = list(tmp_path.glob("allreduce-*-tcp-n2.json"))
    assert len(files) == 1, job.report()
    data = json.loads(files[0].read_text())
    assert set(data["rules"]) == {"2"} and "mpi" not in data["model"]  # no MPI, no window
    assert f"calibration {files[0]}" in job.stdout


@pytest.mark.mpi
def test_tune_dry_run_writes_nothing_and_says_so(tmp_path):
    job = run_mpi(2, ["-m", "minidist.tune", "--max-bytes", "2048", "--dry-run"], timeout_s=90,
                  env={"MINIDIST_CACHE_DIR": str(tmp_path)})
    assert job.returncode == 0, job.report()
    assert list(tmp_path.iterdir()) == []
    assert "--dry-run: nothing written; auto still uses the shipped table" in job.stdout
    assert "delete it" not in job.stdout, job.stdout
    assert "measured up to 2 KiB; larger messages keep the shipped table's choice" in job.stdout


def test_help_and_docs_agree_on_the_ranges():
    from minidist.auto import calibrate
    from minidist.tune import parse_args

    assert (calibrate.QUICK_MAX_BYTES, calibrate.FULL_MAX_BYTES) == (2 << 20, 32 << 20)
    import contextlib
    import io
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        parse_args(["--help"])
    assert "up to 32 MiB (default: up to 2 MiB)" in " ".join(out.getvalue().split())
    doc = (REPO / "docs" / "benchmarks.md").read_text()
    assert "--full   # up to 32 MiB" in doc and "64 MiB" not in doc.split(
        "## Tuning auto for your machine")[1].split("\n## ")[0]


def test_show_in_one_process_names_the_table_in_use_and_where_it_came_from(tmp_path):
    from minidist.auto import calibrate

    env = {"MINIDIST_CACHE_DIR": str(tmp_path)}
    shipped = run_python(["-m", "minidist.tune", "--show", "--world-size", "4"], timeout_s=60,
                         env=env)
    assert shipped.returncode == 0, shipped.report()
    assert ("# auto on mpi, n=4: shipped table (minidist/auto/auto_defaults.json)"
            in shipped.stdout), shipped.stdout
    assert f"cache folder: {tmp_path}" in shipped.stdout

    key = calibrate.cache_key("mpi", 3)  # a calibration of this host, as minidist.tune writes
    path = tmp_path / calibrate.cache_path("mpi", 3).name
    calibrate.save({"format": calibrate.FORMAT, "key": key, "rules": {"3": [[None, "tree"]]},
                    "model": {}}, path)
    mine = run_python(["-m", "minidist.tune", "--show"], timeout_s=60, env=env)
    assert mine.returncode == 0, mine.report()
    assert f"# auto on mpi, n=3: calibration {path}" in mine.stdout, mine.stdout
    assert "   1 MiB         tree" in mine.stdout  # its rule, beside the shipped pick
    off = run_python(["-m", "minidist.tune", "--show"], timeout_s=60,
                     env={**env, "MINIDIST_TUNE": "0"})
    assert "n=3: shipped table" in off.stdout and "MINIDIST_TUNE=0" in off.stdout, off.stdout
