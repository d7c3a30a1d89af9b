"""examples/train.py --zero at toy size: Trainer checkpoints of a ZeRO optimizer resume exactly."""

import re

import pytest

from procs import REPO, run_env_ranks, run_mpi

TRAIN = REPO / "examples" / "train.py"


@pytest.mark.mpi
def test_train_zero_resume_equals_a_straight_run(tmp_path):
    """3 ranks (unequal chunks): 1 epoch, stop, --resume 1 more == 2 epochs straight."""
    common = [TRAIN, "--zero", "--epochs", "2", "--hidden", "64", "--seed", "3"]
    first = run_mpi(3, [*common, "--checkpoint-dir", tmp_path, "--checkpoint-every", "1",
                        "--stop-after-epochs", "1"], timeout_s=120)
    assert first.returncode == 0, first.report()
    resumed = run_mpi(3, [*common, "--checkpoint-dir", tmp_path, "--resume"], timeout_s=120)
    assert resumed.returncode == 0, resumed.report()
    straight = run_mpi(3, common, timeout_s=120)
    assert straight.returncode == 0, straight.report()
    assert "zero: ZeRO-1 on, adamw state sharded over 3 rank(s)" in straight.stdout, straight.stdout

    def epoch2(out):
        return re.findall(r"^epoch 2/2 +(loss .*val_acc [0-9.]+)", out, flags=re.M)

    assert epoch2(resumed.stdout) == epoch2(straight.stdout) != [], (resumed.stdout,
                                                                      straight.stdout)


def test_train_refuses_zero_with_amp():
    result = run_env_ranks(1, [TRAIN, "--zero", "--amp"], timeout_s=60)
    assert result.returncode != 0 and "--zero does not combine with --amp" in result.stderr
