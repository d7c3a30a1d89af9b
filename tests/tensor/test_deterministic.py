"""Deterministic mode (minidist/tensor/deterministic.py) and its fixed-order kernels.

The references here use only elementwise IEEE operations (+, *, one rounding), never BLAS or
NumPy's exp/log, so they give the same bits on every machine, as the kernels must."""

import math

import numpy as np
import pytest

import minidist as md
from minidist.tensor import deterministic, fixed_order


def k_order_product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b with every output's sum in k order, in float64, rounded once: the promise."""
    acc = np.zeros((a.shape[0], b.shape[1]), np.float64)
    for k in range(a.shape[1]):
        acc += a[:, k:k + 1].astype(np.float64) * b[k:k + 1, :].astype(np.float64)
    return acc.astype(np.result_type(a, b))


@pytest.fixture
def deterministic_on():
    md.use_deterministic_algorithms(True)
    yield
    md.use_deterministic_algorithms(False)


@pytest.mark.parametrize("shape", [(16, 64, 512), (10, 16, 256), (3, 1, 7), (1, 300, 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matmul_sums_in_k_order_in_float64(shape, dtype):
    n, k, m = shape
    rng = np.random.default_rng(k)
    a = rng.standard_normal((n, k)).astype(dtype)
    b = rng.standard_normal((k, m)).astype(dtype)
    got = fixed_order.matmul(a, b)
    assert got.dtype == dtype and got.shape == (n, m)
    assert np.array_equal(got, k_order_product(a, b))
    out = np.empty((n, m), dtype)
    assert fixed_order.matmul(a, b.T.copy().T, out=out) is out  # strided operand, given out
    assert np.array_equal(out, got)


def test_matmul_follows_numpy_shapes():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((3, 1, 4, 5)), rng.standard_normal((2, 5, 6))
    assert fixed_order.matmul(a, b).shape == (3, 2, 4, 6)
    assert np.allclose(fixed_order.matmul(a, b), a @ b, rtol=1e-12, atol=1e-12)
    v = rng.standard_normal(5)
    assert fixed_order.matmul(v, b[0]).shape == (6,)
    assert fixed_order.matmul(b[0].T, v).shape == (6,)
    assert fixed_order.matmul(v, v).shape == () and np.isclose(fixed_order.matmul(v, v), v @ v)
    ints = np.arange(6).reshape(2, 3)
    assert np.array_equal(fixed_order.matmul(ints, ints.T), ints @ ints.T)


def test_exp_and_log_are_the_float64_result_rounded_once():
    """float32: the float64 value rounded once; checked against Python's math module on a
    sample (math.exp/log are within an ulp of float64, far below float32's rounding)."""
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(2000) * 20).astype(np.float32)
    want = np.array([math.exp(float(v)) if v < 88 else math.inf for v in x]).astype(np.float32)
    assert np.array_equal(fixed_order.exp(x), want)
    y = np.abs(x) + np.float32(1e-3)
    want = np.array([math.log(float(v)) for v in y]).astype(np.float32)
    assert np.array_equal(fixed_order.log(y), want)
    d = rng.standard_normal(2000) * 50
    assert np.allclose(fixed_order.exp(d), np.exp(d), rtol=4e-16, atol=0)
    assert np.allclose(fixed_order.log(np.abs(d)), np.log(np.abs(d)), rtol=4e-16, atol=1e-15)


def test_exp_and_log_special_values():
    with np.errstate(all="ignore"):
        x = np.array([0.0, -np.inf, np.inf, np.nan, 800.0, -800.0, 1e-310])
        assert np.array_equal(fixed_order.exp(x), np.exp(x), equal_nan=True)
        y = np.array([0.0, 1.0, -1.0, np.inf, np.nan, 1e-310, 5e-324])
        got, want = fixed_order.log(y), np.log(y)
    assert np.array_equal(got[:5], want[:5], equal_nan=True)
    assert np.allclose(got[5:], want[5:], rtol=1e-15)


def test_mode_routes_the_tensor_layer_through_fixed_order(deterministic_on):
    """linear, matmul, exp, log, softmax, log_softmax and cross_entropy in the mode use the
    fixed-order kernels: their results equal the k-order, once-rounded references."""
    assert md.are_deterministic_algorithms_enabled()
    assert not md.is_deterministic_algorithms_warn_only_enabled()
    rng = np.random.default_rng(2)
    x = rng.standard_normal((8, 300)).astype(np.float32)
    w = rng.standard_normal((5, 300)).astype(np.float32)
    out = md.tensor.linear(md.Tensor(x), md.Tensor(w))
    assert np.array_equal(out.array, k_order_product(x, w.T))
    assert np.array_equal((md.Tensor(x) @ md.Tensor(w.T)).array, k_order_product(x, w.T))
    z = md.Tensor(x[:, :5])
    assert np.array_equal(md.exp(z).array, fixed_order.exp(x[:, :5]))
    assert np.array_equal(md.log(md.exp(z)).array, fixed_order.log(fixed_order.exp(x[:, :5])))
    shifted = x[:, :5] - x[:, :5].max(axis=1, keepdims=True)
    e = fixed_order.exp(shifted)
    assert np.array_equal(md.softmax(z, dim=1).array, e / e.sum(axis=1, keepdims=True))
    logp = shifted - fixed_order.log(e.sum(axis=1, keepdims=True))
    assert np.array_equal(md.tensor.log_softmax(z, dim=1).array, logp)
    t = np.arange(8) % 5
    loss = md.tensor.cross_entropy(z, t, reduction="none")
    assert np.array_equal(loss.array, fixed_order.log(e.sum(axis=1)) - shifted[np.arange(8), t])


def test_mode_switch_is_torchs():
    assert not md.are_deterministic_algorithms_enabled()
    assert deterministic.array_math(np) is np
    md.use_deterministic_algorithms(True, warn_only=True)
    try:
        assert md.is_deterministic_algorithms_warn_only_enabled()
        assert deterministic.array_math(np) is fixed_order
    finally:
        md.use_deterministic_algorithms(False)
    assert deterministic.array_math(np) is np
    with pytest.raises(TypeError, match="True or False"):
        md.use_deterministic_algorithms(1)
