"""How a Tensor prints and formats: torch's layout (checked against torch when it is installed)."""

import numpy as np
import pytest

import minidist
from minidist.tensor import Tensor

CASES = [np.float32(0.5), [0.5, 0.25], [1.0, 2.0], [1e-5, 1.0], [1e9, 1.0], [0.0, -3.5],
         [[1.25, -2.0], [3.0, 4.5]], [1, 2, 30], [True, False], [float("nan"), 1.5],
         [float("inf"), 2.0]]


def test_zero_dim_tensor_formats_as_its_number():
    t = minidist.tensor(0.123456)
    assert format(t, ".4f") == "0.1235" and f"{t:.2e}" == "1.23e-01"
    assert f"{minidist.tensor(3)}" == "3"
    with pytest.raises(TypeError):
        format(minidist.ones(2), ".4f")       # as torch: only a 0-d tensor takes a spec
    assert f"{minidist.ones(2)}" == str(minidist.ones(2)) == "tensor([1., 1.])"


def test_repr_is_torch_like():
    assert repr(minidist.tensor(0.5)) == "tensor(0.5000)"
    assert str(minidist.tensor([0.5, 0.25])) == "tensor([0.5000, 0.2500])"
    assert repr(minidist.ones(2, requires_grad=True)) == "tensor([1., 1.], requires_grad=True)"
    assert repr(minidist.ones(2, dtype=minidist.float64)) == \
        "tensor([1., 1.], dtype=minidist.float64)"
    assert "grad_fn=<MulBackward>" in repr(minidist.ones(2, requires_grad=True) * 2)
    assert float(minidist.tensor(2.5)) == 2.5 and int(minidist.tensor(7)) == 7
    assert minidist.ones(2, 2).tolist() == [[1.0, 1.0], [1.0, 1.0]]
    np.testing.assert_array_equal(np.asarray(minidist.arange(3)), [0, 1, 2])


@pytest.mark.parametrize("values", CASES, ids=[str(c) for c in CASES])
def test_values_print_as_torch_prints_them(values):
    torch = pytest.importorskip("torch")
    a = np.array(values)
    a = a.astype(np.float32) if a.dtype == np.float64 else a
    expected = repr(torch.from_numpy(a)).replace(" ...,", "...,")
    assert repr(Tensor(a)) == expected
    if a.ndim == 0:
        assert format(Tensor(a), ".3f") == format(torch.from_numpy(a), ".3f")
        assert f"{Tensor(a)}" == f"{torch.from_numpy(a)}"
