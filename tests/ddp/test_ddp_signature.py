"""DistributedDataParallel accepts torch's constructor arguments, in torch's order."""

import inspect

import numpy as np
import pytest

from minidist import nn
from minidist.ddp import DistributedDataParallel
from minidist.tensor import Tensor

TORCH_ORDER = ["module", "device_ids", "output_device", "dim", "broadcast_buffers", "init_sync",
               "process_group", "bucket_cap_mb", "find_unused_parameters", "check_reduction",
               "gradient_as_bucket_view", "static_graph"]


def test_positional_order_is_torchs():
    params = list(inspect.signature(DistributedDataParallel.__init__).parameters.values())[1:]
    positional = [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert positional == TORCH_ORDER


def test_positional_order_matches_installed_torch():
    torch = pytest.importorskip("torch")
    sig = inspect.signature(torch.nn.parallel.DistributedDataParallel.__init__)
    assert list(sig.parameters)[1:1 + len(TORCH_ORDER)] == TORCH_ORDER


def test_torch_style_cpu_call_and_minidist_keywords_work(group):
    nn.manual_seed(0)
    m = nn.Linear(4, 2)
    ddp = DistributedDataParallel(m, device_ids=None, output_device=None, bucket_cap_mb=None,
                                  find_unused_parameters=False, gradient_as_bucket_view=True,
                                  static_graph=True, overlap=False, nonfinite_grads="raise")
    (ddp(Tensor(np.ones((3, 4), np.float32))) ** 2).mean().backward()
    assert all(p.grad is not None for p in m.parameters())
    ddp.close()


@pytest.mark.parametrize("kwargs, match", [
    ({"device_ids": [0]}, "parameters are on cpu"),
    ({"device_ids": ["cuda:0"]}, "parameters are on cpu"),
    ({"device_ids": ["cpu"]}, "parameters are on cpu"),
    ({"device_ids": 0}, "one-element list"),
    ({"device_ids": [0, 1]}, "one-element list"),
    ({"output_device": 0}, "without device_ids"),
])
def test_device_ids_must_agree_with_the_parameters(group, kwargs, match):
    with pytest.raises(ValueError, match=match):
        DistributedDataParallel(nn.Linear(2, 2), **kwargs)


@pytest.mark.mpi
def test_a_torch_script_ported_by_imports_trains_and_saves_on_two_ranks(tmp_path):
    from procs import REPO, run_mpi

    result = run_mpi(2, [REPO / "tests/ddp/ported_torch_script.py", tmp_path / "m.npz"],
                     timeout_s=90)
    assert result.returncode == 0, result.report()
    assert result.stdout.count("ported script ok") == 2, result.report()
