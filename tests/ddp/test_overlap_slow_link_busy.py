"""examples/course/overlap_slow_link.py on a machine too busy to show its point says so instead
of printing a ratio (under a load average of 11 on 2 cores it printed 0.65 where a quiet run
gives about 1.2). ``--max-load-per-core 0`` makes any load count as too busy, so the test does
not depend on what else runs beside it."""

from procs import REPO, run_env_ranks

SCRIPT = REPO / "examples" / "course" / "overlap_slow_link.py"


def test_too_busy_a_machine_gets_a_sentence_not_a_ratio():
    res = run_env_ranks(1, [SCRIPT, "--quick", "--latency-ms", "1", "--max-load-per-core", "0"],
                        timeout_s=120)
    assert res.returncode == 0, res.report()
    assert "the machine is too busy to show the point: load average " in res.stdout, res.report()
    assert "ratio" not in res.stdout, res.report()
    assert "on every rank: OK" in res.stdout, res.report()   # the gradients are still checked
