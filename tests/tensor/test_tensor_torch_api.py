"""Tensor methods spelled torch's way beside NumPy's, checked against NumPy (and torch if present)."""

import numpy as np
import pytest

import minidist
from minidist import nn
from minidist.tensor import Tensor, is_grad_enabled, set_grad_enabled

RNG = np.random.default_rng(0)


def x3():
    return RNG.permutation(24).reshape(2, 3, 4).astype(np.float64)


def test_dim_and_keepdim_match_axis_and_keepdims():
    x = x3()
    t = Tensor(x)
    np.testing.assert_array_equal(t.sum(dim=1, keepdim=True).array, x.sum(1, keepdims=True))
    np.testing.assert_array_equal(t.mean(dim=(0, 2)).array, x.mean((0, 2)))
    np.testing.assert_array_equal(t.sum(1).array, x.sum(1))
    with pytest.raises(TypeError, match="both axis"):
        t.sum(axis=0, dim=1)


def test_max_dim_returns_values_and_indices_and_numpy_spelling_returns_values():
    x = x3()
    t = Tensor(x, requires_grad=True)
    values, indices = t.max(1)
    np.testing.assert_array_equal(values.array, x.max(1))
    np.testing.assert_array_equal(indices.array, x.argmax(1))
    assert indices.dtype == np.int64 and t.max(1)[1] is not None
    v, i = t.min(dim=-1, keepdim=True)
    np.testing.assert_array_equal(v.array, x.min(-1, keepdims=True))
    np.testing.assert_array_equal(i.array, x.argmin(-1)[..., None])
    np.testing.assert_array_equal(t.max(axis=1).array, x.max(1))   # NumPy's spelling: values
    assert t.max().array == x.max()
    values.sum().backward()
    want = np.zeros_like(x)
    np.put_along_axis(want, x.argmax(1)[:, None, :], 1.0, axis=1)
    np.testing.assert_array_equal(t.grad, want)
    np.testing.assert_array_equal(t.argmax(dim=2, keepdim=True).array, x.argmax(2)[..., None])


def test_size_view_unsqueeze_squeeze_flatten():
    t = Tensor(x3())
    assert t.size == 24 and t.size() == (2, 3, 4) and t.size(1) == 3 and t.size(-1) == 4
    assert t.dim() == 3
    assert t.view(6, 4).shape == (6, 4) and t.view(-1).shape == (24,)
    assert t.view_as(Tensor(np.zeros((4, 6)))).shape == (4, 6)
    assert t.unsqueeze(0).shape == (1, 2, 3, 4) and t.unsqueeze(-1).shape == (2, 3, 4, 1)
    one = Tensor(np.zeros((1, 3, 1)))
    assert one.squeeze().shape == (3,) and one.squeeze(0).shape == (3, 1)
    assert one.squeeze(1).shape == (1, 3, 1)                       # not size 1: unchanged
    assert t.flatten().shape == (24,) and t.flatten(1).shape == (2, 12)
    assert t.flatten(0, 1).shape == (6, 4)


def test_comparisons_clone_and_in_place_fills():
    a = Tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    assert a.eq(np.array([1.0, 0.0, 3.0])).array.tolist() == [True, False, True]
    assert a.eq(Tensor(np.array([1.0, 2.0, 0.0]))).array.sum() == 2
    assert (a > 1.5).array.tolist() == [False, True, True]
    assert bool(Tensor(np.array([2.0])) > 1) is True
    with pytest.raises(RuntimeError, match="ambiguous"):
        bool(a > 0)
    c = a.clone()
    c.sum().backward()
    np.testing.assert_array_equal(a.grad, np.ones(3))
    assert not np.shares_memory(c.array, a.array)
    b = Tensor(np.zeros((50, 40), np.float32))
    assert b.fill_(2.5).array.min() == 2.5 and b.zero_().array.max() == 0
    minidist.manual_seed(0)
    b.normal_(1.0, 0.5)
    assert b.dtype == np.float32 and abs(b.array.mean() - 1.0) < 0.05 and abs(b.array.std() - 0.5) < 0.05
    b.uniform_(-1, 1)
    assert -1 <= b.array.min() and b.array.max() < 1
    b.copy_(np.ones(40))
    assert b.array.sum() == 2000
    lin = nn.Linear(3, 2)
    nn.init.normal_(lin.weight, 0.0, 0.02)
    nn.init.constant_(lin.bias, 0.1)
    np.testing.assert_allclose(lin.bias.array, 0.1)


def test_integer_and_bool_casts():
    t = Tensor(np.array([0.0, 1.7, -2.2]))
    assert t.long().dtype == np.int64 and t.long().array.tolist() == [0, 1, -2]
    assert t.int().dtype == np.int32 and t.bool().array.tolist() == [False, True, True]


def test_set_grad_enabled_is_a_call_and_a_context_manager():
    assert is_grad_enabled()
    with set_grad_enabled(False):
        assert not is_grad_enabled()
        with set_grad_enabled(True):
            assert is_grad_enabled()
        assert not is_grad_enabled()
    assert is_grad_enabled()
    try:
        with pytest.raises(KeyError):
            with set_grad_enabled(False):
                raise KeyError("x")
        assert is_grad_enabled()
        set_grad_enabled(False)                  # a plain call switches it, as torch
        assert not is_grad_enabled()
    finally:
        set_grad_enabled(True)


def test_against_torch():
    torch = pytest.importorskip("torch")
    x = x3()
    tt, mt = torch.from_numpy(x), Tensor(x)
    for dim in (0, 1, -1):
        for keepdim in (False, True):
            rv, ri = tt.max(dim, keepdim)
            mv, mi = mt.max(dim, keepdim)
            np.testing.assert_array_equal(rv.numpy(), mv.array)
            np.testing.assert_array_equal(ri.numpy(), mi.array)
            np.testing.assert_array_equal(tt.min(dim=dim, keepdim=keepdim).indices.numpy(),
                                          mt.min(dim=dim, keepdim=keepdim).indices.array)
            np.testing.assert_array_equal(tt.argmax(dim, keepdim).numpy(),
                                          mt.argmax(dim, keepdim).array)
            np.testing.assert_allclose(tt.sum(dim=dim, keepdim=keepdim).numpy(),
                                       mt.sum(dim=dim, keepdim=keepdim).array)
    assert tuple(tt.size()) == mt.size() and tt.size(1) == mt.size(1)
    for dim in (0, -1, 2, -4):
        assert tuple(tt.unsqueeze(dim).shape) == mt.unsqueeze(dim).shape
    assert tuple(tt.flatten(1, 2).shape) == mt.flatten(1, 2).shape
    one = torch.zeros(1, 3, 1)
    assert tuple(one.squeeze(1).shape) == Tensor(np.zeros((1, 3, 1))).squeeze(1).shape
