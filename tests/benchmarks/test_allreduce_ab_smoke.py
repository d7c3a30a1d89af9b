"""benchmarks/allreduce_ab.py: an older commit's all_reduce beside this checkout's, alternated."""

import json

import pytest

from procs import REPO, in_a_git_checkout, run_python

AB = REPO / "benchmarks" / "allreduce_ab.py"


@pytest.mark.mpi
def test_allreduce_ab_alternates_the_sides_and_prints_the_ratios(tmp_path):
    if not in_a_git_checkout():
        pytest.skip("needs a git checkout (the old side is exported with git archive)")
    res = run_python([AB, "--old", "HEAD", "--rounds", "2", "--sizes", "8,1K", "--iters", "20",
                      "--warmup", "2", "--out", tmp_path], timeout_s=120,
                     env={"MINIDIST_TIMEOUT_S": "30"})
    assert res.returncode == 0, res.report()
    data = json.loads((tmp_path / "allreduce_ab.json").read_text())
    assert [r["first"] for r in data["rounds"]] == ["old", "new"]  # the order flips
    for r in data["rounds"]:
        for side in ("old", "new"):
            assert [row["nbytes"] for row in r[side]["rows"]] == [8, 1024]
            assert all(row["auto_us"] > 0 and row["raw_us"] > 0 for row in r[side]["rows"])
    assert "old ratio" in res.stdout and "1 KiB" in res.stdout


def test_allreduce_ab_names_a_bad_commit_in_one_line(tmp_path):
    if not in_a_git_checkout():
        pytest.skip("needs a git checkout")
    res = run_python([AB, "--old", "no-such-commit", "--out", tmp_path], timeout_s=30)
    assert res.returncode == 1, res.report()
    assert "--old 'no-such-commit' is not a commit of this repository" in res.stderr
    assert "Traceback" not in res.stderr
