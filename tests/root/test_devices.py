"""torch's device spellings: minidist.device, Tensor.to/cpu/cuda, Module.to/float/double, cuda.*"""

import numpy as np
import pytest

import minidist
from minidist import nn, optim
from minidist.tensor import Tensor

needs_no_gpu = pytest.mark.skipif(minidist.cuda.is_available(), reason="checks the CPU-only path")


def test_device_parsing_and_equality():
    assert minidist.device("cuda:1") == minidist.device("cuda", 1)
    assert str(minidist.device("CUDA:0")) == "cuda:0"
    assert minidist.device("cpu") == "cpu"
    assert minidist.device(minidist.device("cuda:2")).index == 2
    assert repr(minidist.device("cpu")) == "device(type='cpu')"
    for bad in ("tpu", "cuda:x", "cpu:1"):
        with pytest.raises(ValueError, match="device"):
            minidist.device(bad)


def test_tensor_to_dtype_and_device_keeps_the_tape():
    t = Tensor(np.array([1.0, 2.0], np.float32), requires_grad=True)
    assert t.device == minidist.device("cpu") and not t.is_cuda
    assert t.to("cpu") is t and t.cpu() is t and t.to(device="cpu") is t
    d = t.to(np.float64)
    assert d.dtype == np.float64
    (d * d).sum().backward()
    np.testing.assert_allclose(t.grad, [2.0, 4.0])
    assert t.grad.dtype == np.float32
    assert t.to("cpu", np.float16).dtype == np.float16
    assert t.to(Tensor(np.zeros(1, np.float64))).dtype == np.float64
    with pytest.raises(TypeError, match="device or a dtype"):
        t.to("banana")


def test_module_to_moves_in_place_and_an_earlier_optimizer_still_works():
    minidist.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    model.register_buffer("steps", np.zeros((), np.int64))
    params = list(model.parameters())
    opt = optim.SGD(model.parameters(), lr=0.1)
    before = [p.array.copy() for p in params]
    assert model.to("cpu").double() is model
    assert all(a is b for a, b in zip(params, model.parameters()))
    assert all(p.dtype == np.float64 for p in params)
    assert model.steps.dtype == np.int64  # a dtype applies to floating tensors only
    x = Tensor(np.ones((2, 3)), dtype=np.float64)
    model(x).sum().backward()
    opt.step()
    assert any(not np.array_equal(p.array, b) for p, b in zip(params, before))
    model.float()
    assert all(p.dtype == np.float32 and p.grad.dtype == np.float32 for p in params)
    assert model.half().to(dtype=np.float32) is model


@needs_no_gpu
def test_cuda_on_a_cpu_only_machine_says_what_is_missing():
    assert minidist.cuda.device_count() == 0
    model = nn.Linear(2, 2)
    for call in (lambda: model.cuda(), lambda: model.to("cuda:0"), lambda: Tensor([1.0]).cuda(),
                 lambda: minidist.cuda.set_device(0), lambda: minidist.cuda.current_device()):
        with pytest.raises(minidist.DeviceUnavailableError, match="MINIDIST_DEVICE=cpu"):
            call()
    assert model.weight.device == "cpu"  # a failed move changes nothing


def test_module_to_against_torch():
    torch = pytest.importorskip("torch")
    tm = torch.nn.Linear(3, 2).double()
    mm = nn.Linear(3, 2).double()
    assert str(tm.weight.dtype).removeprefix("torch.") == str(mm.weight.dtype).removeprefix("minidist.")
    assert str(torch.device("cuda:1")) == str(minidist.device("cuda:1"))
