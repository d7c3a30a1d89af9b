"""Tensor ``==`` is elementwise (torch's), hashing by identity; identity-keyed weak maps; a
float64 input to a float32 layer raises; one clip_grad_norm_ under nn.utils and optim."""

import gc

import numpy as np
import pytest

import minidist
from minidist import Tensor, nn, optim
from minidist.tensor import WeakIdKeyDictionary


def test_eq_is_elementwise_and_hash_is_identity():
    a, b = Tensor([1.0, 2.0, 3.0]), Tensor([1.0, 0.0, 3.0])
    np.testing.assert_array_equal((a == b).array, [True, False, True])
    np.testing.assert_array_equal((a != b).array, [False, True, False])
    np.testing.assert_array_equal((a == 2.0).array, [False, True, False])
    assert len({a, b, a}) == 2 and {a: 1}[a] == 1
    with pytest.raises(RuntimeError, match="ambiguous"):
        bool(a == b)
    c = Tensor([5.0])
    assert bool(c == 5.0)


def test_weak_id_key_dictionary_keys_by_identity_and_forgets_dead_keys():
    d = WeakIdKeyDictionary()
    a, b = Tensor(np.zeros(3)), Tensor(np.zeros(3))       # equal values, different tensors
    d[a] = "a"
    assert d.get(a) == "a" and d.get(b) is None and a in d and b not in d
    d[b] = "b"
    assert len(d) == 2 and d[b] == "b"
    del a
    gc.collect()
    assert len(d) == 1 and list(d.keys()) == [b]


def test_float64_input_to_a_float32_layer_raises():
    layer = nn.Linear(3, 2)
    with pytest.raises(TypeError, match="input dtype float64 differs from weight dtype float32"):
        layer(np.ones((4, 3)))                             # NumPy's default float64
    assert layer(np.ones((4, 3), np.float32)).dtype == np.float32
    assert layer.double()(np.ones((4, 3))).dtype == np.float64
    with pytest.raises(TypeError, match="conv2d: input dtype float64"):
        nn.Conv2d(1, 2, 3)(np.ones((1, 1, 5, 5)))


def test_clip_grad_is_one_function_under_nn_utils_and_optim():
    assert nn.utils.clip_grad_norm_ is optim.clip_grad_norm_
    assert nn.utils.clip_grad_value_ is optim.clip_grad_value_
    p = nn.Parameter(np.zeros(4, np.float32))
    p.grad = np.array([3.0, -4.0, 0.5, -0.1], np.float32)
    nn.utils.clip_grad_value_([p], 1.0)
    np.testing.assert_array_equal(p.grad, np.float32([1.0, -1.0, 0.5, -0.1]))
    total = minidist.nn.utils.clip_grad_norm_(p, 0.1)
    assert total == pytest.approx(np.sqrt(2.26), rel=1e-6)
    assert np.linalg.norm(p.grad) == pytest.approx(0.1, rel=1e-4)
