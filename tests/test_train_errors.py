"""A user's mistake ends examples/train.py with ONE line per job (rank 0's), never a traceback
per rank, and bad flag values are refused before any process group exists."""

import re

import pytest

from procs import REPO, run_env_ranks, run_mpi

TRAIN = REPO / "examples" / "train.py"
QUICK = ["--hidden", "16", "--epochs", "1"]  # a one-epoch run takes about a second


def one_line_error(result) -> str:
    """The job failed with exactly one non-empty stderr line and no traceback; return it."""
    assert result.returncode != 0, result.report()
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.report()
    assert lines[0].startswith("train.py: "), result.report()
    return lines[0]


@pytest.mark.parametrize("args,says", [
    (["--batch-size", "0"], "--batch-size 0 is out of range; it must be >= 1"),
    (["--epochs", "0"], "--epochs 0 is out of range; it must be >= 1"),
    (["--lr", "-1"], "--lr -1.0 is out of range; it must be > 0"),
    (["--model", "resnet"], "invalid choice: 'resnet'"),
])
def test_bad_flag_values_get_one_line(args, says):
    line = one_line_error(run_env_ranks(1, [TRAIN, *args], timeout_s=60))
    assert says in line


def test_mnist_without_data_root_names_the_flag_and_the_download():
    line = one_line_error(run_env_ranks(1, [TRAIN, "--dataset", "mnist"], timeout_s=60))
    assert "--data-root DIR" in line and "root=" not in line and "https://" in line


def test_mnist_with_a_missing_folder_names_the_flag_and_the_download(tmp_path):
    missing = tmp_path / "no-such-folder"
    line = one_line_error(run_env_ranks(
        1, [TRAIN, "--dataset", "fashion-mnist", "--data-root", missing], timeout_s=60))
    assert f"--data-root {missing}" in line and "root=" not in line
    assert "train-images-idx3-ubyte" in line and "https://" in line


@pytest.mark.mpi
def test_usage_error_on_two_ranks_is_one_line_for_the_job():
    line = one_line_error(run_mpi(2, [TRAIN, "--batch-size", "0"], timeout_s=60))
    assert "--batch-size 0" in line


@pytest.mark.mpi
def test_resume_at_another_world_size_is_one_line_naming_both_sizes(tmp_path):
    first = run_env_ranks(1, [TRAIN, *QUICK, "--checkpoint-dir", tmp_path], timeout_s=90)
    assert first.returncode == 0, first.report()
    line = one_line_error(run_mpi(2, [TRAIN, *QUICK, "--epochs", "2", "--checkpoint-dir",
                                      tmp_path, "--resume"], timeout_s=90))
    assert re.search(r"world size 1, resuming at 2", line), line


def test_resuming_a_finished_run_says_it_is_complete(tmp_path):
    first = run_env_ranks(1, [TRAIN, *QUICK, "--checkpoint-dir", tmp_path], timeout_s=90)
    assert first.returncode == 0, first.report()
    again = run_env_ranks(1, [TRAIN, *QUICK, "--checkpoint-dir", tmp_path, "--resume"],
                          timeout_s=90)
    assert again.returncode == 0, again.report()
    assert "is complete (1 epochs done, epochs=1); nothing to train" in again.stdout
    assert "--epochs N" in again.stdout
    assert "epochs 2..1" not in again.stdout and not re.search(r"^epoch ", again.stdout, re.M)


DIVERGE = ["--lr", "1e6", "--optimizer", "sgd", "--hidden", "16", "--epochs", "3"]


@pytest.mark.mpi
def test_a_diverged_run_stops_at_the_step_in_one_line_naming_the_tensors():
    """Before: 12 lines of NumPy warnings, a warning per rank, every epoch trained on NaN,
    "the run diverged" printed once per rank."""
    job = run_mpi(2, [TRAIN, *DIVERGE], timeout_s=90)
    line = one_line_error(job)
    assert job.returncode == 1, job.report()
    assert re.search(r"non-finite \(NaN/inf\) averaged gradient at step \d+ in \['", line), line
    assert "0.weight" in line and "--allow-nonfinite" in line, line
    assert "epoch 1/3" not in job.stdout, job.report()  # stopped in the first epoch


@pytest.mark.mpi
def test_allow_nonfinite_trains_on_and_says_it_diverged_once():
    job = run_mpi(2, [TRAIN, *DIVERGE, "--allow-nonfinite"], timeout_s=120)
    assert job.returncode == 1, job.report()
    assert len(re.findall(r"^epoch \d/3  loss nan", job.stdout, re.M)) == 3, job.report()
    assert job.stderr.count("the run diverged") == 1, job.report()
