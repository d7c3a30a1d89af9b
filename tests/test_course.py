"""The course (examples/course/, docs/course.md): every step's check passes at n = 2 and 3,
and step 6 runs DDP over the threads transport. The tasks and their solutions are checked by
tests/test_course_tasks.py (task 2.1 runs solutions/ring_any_count.py's ring)."""

import pytest

from procs import REPO, run_env_ranks, run_mpi

COURSE = REPO / "examples" / "course"
STEPS = sorted(p.name for p in COURSE.glob("0*.py"))


def test_there_are_six_short_steps():
    assert len(STEPS) == 6, STEPS
    for name in STEPS:
        text = (COURSE / name).read_text()
        assert len(text.splitlines()) <= 130, f"{name} is longer than a course step should be"
        assert f"./mpirun.sh -n 2 python examples/course/{name}" in text, name


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
def test_every_step_checks_ok_under_mpiexec(n):
    result = run_mpi(n, [REPO / "tests" / "course_steps.py"], timeout_s=180)
    assert result.returncode == 0, result.report()
    for name in STEPS:
        assert result.stdout.count(f"step {name}: exit 0") == n, result.report()
    assert result.stdout.count(": OK") == n * len(STEPS), result.report()
    assert "FAILED" not in result.stdout, result.report()
    # each timing comes with what it means on this machine (docs/course.md explains the range)
    for said in ("here communication adds", "bucketing paid here" if "bucketing paid" in
                 result.stdout else "bucketing did not pay here", "overlap", "naive's speed here"):
        assert said in result.stdout, result.report()


def test_step6_ddp_over_thread_ranks_in_one_process():
    result = run_env_ranks(1, [COURSE / "06_ddp.py", "--threads", "3", "--quick"], timeout_s=120)
    assert result.returncode == 0, result.report()
    assert result.stdout.count("check: DDP parameters equal NaiveDataParallel") == 3
    assert "(threads)" in result.stdout
    assert "no launcher detected" not in result.stderr, result.stderr  # it is one process


def test_course_doc_snippets_run(tmp_path):
    """The Python blocks of docs/course.md run as written (one process, thread ranks)."""
    import re
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "docs" / "course.md").read_text(), re.S)
    assert blocks
    for i, block in enumerate(blocks):
        script = tmp_path / f"course_snippet_{i}.py"
        script.write_text(block + "\nprint('snippet ok')\n")
        result = run_env_ranks(1, [script], timeout_s=60)
        assert result.returncode == 0 and "snippet ok" in result.stdout, result.report()


def test_course_doc_names_files_that_exist():
    import re
    text = (REPO / "docs" / "course.md").read_text()
    for path in set(re.findall(r"(?:examples|tests)/[\w/]+\.py", text)):
        assert (REPO / path).exists(), path


def test_overlap_over_a_slow_link_gives_the_same_gradients():
    result = run_env_ranks(1, [COURSE / "overlap_slow_link.py", "--quick", "--latency-ms", "1"],
                           timeout_s=120)
    assert result.returncode == 0, result.report()
    assert "on every rank: OK" in result.stdout, result.report()
