"""DDP in one process (local process group): wrapper behaviour that needs no peers."""

import logging

import numpy as np
import pytest

from minidist import nn
from minidist.ddp import DistributedDataParallel
from minidist.ddp.reducer import StepState
from minidist.tensor import Tensor, no_grad


def model():
    nn.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def step(ddp, seed=0):
    x = np.random.default_rng(seed).normal(size=(3, 4)).astype(np.float32)
    (ddp(Tensor(x)) ** 2).mean().backward()


def test_no_sync_restores_even_after_an_exception(group):
    ddp = DistributedDataParallel(model())
    with pytest.raises(KeyError):
        with ddp.no_sync():
            assert ddp.reducer.require_sync is False
            raise KeyError("boom")
    assert ddp.reducer.require_sync is True
    ddp.close()


def test_accumulation_under_no_sync_and_zero_grad_reattach(group):
    m = model()
    ddp = DistributedDataParallel(m)
    with ddp.no_sync():
        step(ddp, 0)
    step(ddp, 1)
    two = [p.grad.array.copy() for p in m.parameters()]
    m.zero_grad()                                   # grads -> None
    assert all(p.grad is None for p in m.parameters())
    step(ddp, 0)                                    # views re-attached, zeroed
    step_grads = [p.grad.array.copy() for p in m.parameters()]
    assert all(any(np.shares_memory(p.grad, b.buffer) for b in ddp.buckets)
               for p in m.parameters())
    ref = model()
    (ref(Tensor(np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32))) ** 2
     ).mean().backward()
    for a, b in zip(step_grads, ref.parameters()):
        np.testing.assert_allclose(a, b.grad, rtol=1e-6)
    # the accumulated pair is the sum of the two single-step gradients
    ref.zero_grad()
    (ref(Tensor(np.random.default_rng(1).normal(size=(3, 4)).astype(np.float32))) ** 2
     ).mean().backward()
    for t, a, b in zip(two, step_grads, ref.parameters()):
        np.testing.assert_allclose(t, a + b.grad, rtol=1e-5, atol=1e-7)
    ddp.close()


def test_forward_under_no_grad_does_not_start_a_step(group):
    ddp = DistributedDataParallel(model())
    with no_grad():
        ddp(Tensor(np.zeros((2, 4), np.float32)))
    assert ddp.reducer.step_state is StepState.IDLE
    ddp.close()


def test_bad_arguments_are_clear(group):
    with pytest.raises(ValueError, match="no parameter that requires grad"):
        DistributedDataParallel(nn.ReLU())
    ddp = DistributedDataParallel(model())
    with pytest.raises(ValueError, match="not callable"):
        ddp.register_comm_hook(None, "fp16")
    ddp.close()
    with pytest.raises(ValueError, match="nonfinite_grads='loud'"):
        DistributedDataParallel(model(), nonfinite_grads="loud")


def test_nan_warning_names_parameter(group, caplog):
    m = model()
    ddp = DistributedDataParallel(m)
    x = np.full((3, 4), np.nan, np.float32)
    root = logging.getLogger("minidist")
    old, root.propagate = root.propagate, True    # let caplog see minidist's records
    try:
        with caplog.at_level("WARNING", logger="minidist"):
            (ddp(Tensor(x)) ** 2).mean().backward()
    finally:
        root.propagate = old
    assert "non-finite" in caplog.text and "'2.bias'" in caplog.text
    ddp.close()
