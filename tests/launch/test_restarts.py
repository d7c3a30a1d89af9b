"""``python -m minidist.launch --max-restarts N``: after a failure the launcher stops the group
and starts it again (TORCHELASTIC_RESTART_COUNT set), naming each restart and its cause; with
the Trainer's checkpoints the run resumes where it stopped and ends as an unbroken run."""

import re

from procs import REPO, run_python

SCRIPT = REPO / "tests" / "launch" / "restart_rank.py"


def launch(tmp_path, name, mode, *flags):
    return run_python(["-m", "minidist.launch", "--standalone", "--nproc-per-node", "2", *flags,
                       SCRIPT, tmp_path / name, mode], timeout_s=240)


def final(job):
    digest, start, attempt = re.findall(r"RESULT (\w+) start_epoch (\d+) attempt (\d+)",
                                        job.stdout)[-1]
    return digest, int(start), int(attempt)


def test_one_failure_restarts_the_group_which_resumes_from_its_checkpoint(tmp_path):
    broken = launch(tmp_path, "broken", "once", "--max-restarts", "2")
    assert broken.returncode == 0, broken.report()
    assert "restart 1 of 2: rank 1 exited with code 1" in broken.stderr, broken.report()
    assert "TORCHELASTIC_RESTART_COUNT=1" in broken.stderr and "restart 2" not in broken.stderr
    straight = launch(tmp_path, "straight", "never")
    assert straight.returncode == 0, straight.report()
    digest, start, attempt = final(broken)
    assert (start, attempt) == (2, 1), broken.report()          # resumed after epoch 2
    assert digest == final(straight)[0], (broken.report(), straight.report())


def test_restarts_are_bounded_and_the_last_failure_is_the_exit_code(tmp_path):
    job = launch(tmp_path, "always", "always", "--max-restarts", "1")
    assert job.returncode == 1, job.report()
    assert "restart 1 of 1" in job.stderr and "giving up after 1 restart(s)" in job.stderr
    no_flag = launch(tmp_path, "plain", "always")
    assert no_flag.returncode == 1, no_flag.report()
    assert "[minidist.launch] restart" not in no_flag.stderr, no_flag.report()
