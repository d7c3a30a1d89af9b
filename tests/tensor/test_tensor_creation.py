"""Tensor factories with torch's names and default dtypes (and vs torch when it is installed)."""

import numpy as np
import pytest

import minidist
from minidist.tensor import Tensor


def test_default_dtypes_follow_torch():
    assert minidist.tensor([1.0, 2.0]).dtype == np.float32      # Python floats: float32
    assert minidist.tensor([1, 2]).dtype == np.int64
    assert minidist.tensor(np.ones(2)).dtype == np.float64      # an array keeps its dtype
    assert minidist.tensor(np.ones(2), dtype=minidist.float32).dtype == np.float32
    for make in (minidist.zeros, minidist.ones, minidist.empty, minidist.rand, minidist.randn):
        assert make(2, 3).dtype == np.float32 and make((2, 3)).shape == (2, 3)
        assert make(2, dtype=minidist.float64).dtype == np.float64
    assert minidist.arange(5).dtype == np.int64
    assert minidist.arange(0, 1, 0.25).dtype == np.float32
    assert minidist.full((2,), 3).dtype == np.int64 and minidist.full((2,), 3.0).dtype == np.float32
    assert minidist.randint(5, (3,)).dtype == np.int64
    assert minidist.float32 == np.float32 and minidist.long == np.int64


def test_tensor_copies_and_from_numpy_shares():
    a = np.zeros(3)
    t, f = minidist.tensor(a), minidist.from_numpy(a)
    a[0] = 7.0
    assert t.array[0] == 0.0 and f.array[0] == 7.0
    assert f.dtype == np.float64 and minidist.as_tensor(a).array is a
    with pytest.raises(TypeError, match="numpy.ndarray"):
        minidist.from_numpy([1.0])


def test_float64_stays_float64_where_asked_and_gradients_flow():
    x = minidist.tensor(np.arange(3.0), requires_grad=True)
    assert x.dtype == np.float64 and x.is_leaf
    (x * x).sum().backward()
    np.testing.assert_array_equal(x.grad, 2 * np.arange(3.0))
    assert Tensor(np.ones(2)).dtype == np.float64  # Tensor(array) wraps without a cast


def test_like_factories_and_values():
    base = minidist.tensor(np.ones((2, 3), np.float64))
    assert minidist.zeros_like(base).dtype == np.float64
    np.testing.assert_array_equal(minidist.ones_like(base).array, np.ones((2, 3)))
    np.testing.assert_array_equal(minidist.full_like(base, 4).array, np.full((2, 3), 4.0))
    assert minidist.randn_like(base).shape == (2, 3) and minidist.empty_like(base).shape == (2, 3)
    np.testing.assert_array_equal(minidist.arange(1, 7, 2).array, [1, 3, 5])
    r = minidist.rand(1000).array
    assert 0 <= r.min() and r.max() < 1


def test_random_factories_follow_manual_seed():
    minidist.manual_seed(3)
    a = minidist.randn(4).array
    minidist.manual_seed(3)
    np.testing.assert_array_equal(minidist.randn(4).array, a)


def test_bad_size_is_refused():
    with pytest.raises(ValueError, match="non-negative ints"):
        minidist.zeros(-1)


def test_dtypes_match_torch():
    torch = pytest.importorskip("torch")
    a = np.ones(2)
    cases = [(torch.tensor([1.0]), minidist.tensor([1.0])), (torch.tensor([1]), minidist.tensor([1])),
             (torch.tensor(a), minidist.tensor(a)), (torch.from_numpy(a), minidist.from_numpy(a)),
             (torch.arange(5), minidist.arange(5)), (torch.arange(0, 1, 0.5), minidist.arange(0, 1, 0.5)),
             (torch.zeros(2), minidist.zeros(2)), (torch.randn(2), minidist.randn(2)),
             (torch.full((2,), 3), minidist.full((2,), 3)), (torch.randint(5, (3,)), minidist.randint(5, (3,)))]
    for ref, mine in cases:
        assert str(ref.dtype).removeprefix("torch.") == str(mine.dtype).removeprefix("minidist."), \
            (ref, mine)
