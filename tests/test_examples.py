"""The examples run end to end at toy size, in a subprocess with a timeout (horovod runs its examples in CI)."""

import re

import pytest

from procs import REPO, run_env_ranks

TRAIN = REPO / "examples" / "train.py"


def final_accuracy(stdout: str) -> float:
    found = re.findall(r"final test_acc ([0-9.]+)", stdout)
    assert found, f"no 'final test_acc' line in the output:\n{stdout[-2000:]}"
    return float(found[-1])


@pytest.mark.parametrize("args,bar", [
    (["--model", "mlp", "--epochs", "6"], 0.9),
    (["--model", "cnn", "--epochs", "2"], 0.85),
    (["--optimizer", "adamw", "--lr", "3e-3", "--epochs", "6"], 0.9),
    (["--dataset", "synthetic", "--epochs", "3"], 0.9),
])
def test_train_single_process_reaches_accuracy(args, bar):
    result = run_env_ranks(1, [TRAIN, *args], timeout_s=120)
    assert result.returncode == 0, result.report()
    epochs = int(args[args.index("--epochs") + 1])
    assert len(re.findall(r"^epoch +\d+/", result.stdout, flags=re.M)) == epochs, result.report()
    assert final_accuracy(result.stdout) >= bar, result.report()


def test_train_rejects_bad_flags():
    result = run_env_ranks(1, [TRAIN, "--model", "resnet"], timeout_s=60)
    assert result.returncode != 0 and "invalid choice: 'resnet'" in result.stderr
