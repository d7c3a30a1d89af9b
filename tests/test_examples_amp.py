"""The main job with mixed precision, at toy size: --amp and --master-weights learn; --device
cuda on a machine without a GPU stack ends with one clear line and a non-zero status."""

import re

import pytest
from procs import REPO, run_env_ranks, run_mpi

from minidist import xp as backend

TRAIN = REPO / "examples" / "train.py"


def final_accuracy(stdout: str) -> float:
    found = re.findall(r"final test_acc ([0-9.]+)", stdout)
    assert found, f"no 'final test_acc' line in the output:\n{stdout[-2000:]}"
    return float(found[-1])


@pytest.mark.parametrize("flags", [["--amp"], ["--master-weights"]])
def test_train_amp_single_process_learns(flags):
    result = run_env_ranks(1, [TRAIN, *flags, "--epochs", "3", "--hidden", "128"], timeout_s=120)
    assert result.returncode == 0, result.report()
    assert final_accuracy(result.stdout) >= 0.9, result.report()
    assert "amp: float16 autocast on cpu (emulated" in result.stdout
    assert "skipped steps" in result.stdout


@pytest.mark.mpi
def test_train_amp_two_ranks_learns():
    result = run_mpi(2, [TRAIN, "--amp", "--epochs", "3", "--hidden", "128"], timeout_s=120)
    assert result.returncode == 0, result.report()
    assert final_accuracy(result.stdout) >= 0.9 and "world_size 2" in result.stdout


@pytest.mark.skipif(backend.gpu_available(), reason="this machine has a GPU")
def test_device_cuda_without_a_gpu_is_one_clear_line():
    result = run_env_ranks(1, [TRAIN, "--device", "cuda", "--amp"], timeout_s=60)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("train.py: "), result.report()
    assert "CuPy" in lines[0] and "Traceback" not in result.stderr


def test_amp_on_a_model_without_a_float16_path_is_one_clear_line():
    import importlib.util
    import sys

    import numpy as np

    from minidist import nn
    spec = importlib.util.spec_from_file_location("train_example", TRAIN)
    train = importlib.util.module_from_spec(spec)
    sys.modules["train_example"] = train  # dataclasses look their module up there
    spec.loader.exec_module(train)

    class Scale(nn.Module):  # element-wise only: autocast has nothing to cast
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(np.ones(4, np.float32))

        def forward(self, x):
            return x * self.w

    with pytest.raises(train.UsageError, match="model 'scale' runs no op in float16.*drop --amp"):
        train.check_float16_path(Scale(), np.ones((2, 4), np.float32), "cpu", "scale")
    train.check_float16_path(nn.Linear(4, 2), np.ones((2, 4), np.float32), "cpu", "mlp")
