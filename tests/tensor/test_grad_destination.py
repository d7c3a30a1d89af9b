"""Gradient destinations: backward writes a leaf's gradient straight into a reserved buffer.

The zero-copy claim is checked with tracemalloc (NumPy reports its allocations to it): with a
destination, the peak memory a backward allocates stays far below one copy of the weight
gradient, so the gradient was not allocated and then copied in.
"""

import tracemalloc

import numpy as np
import pytest

from minidist.tensor import Tensor, conv2d, linear
from minidist.tensor.scaled_grad import ScaledGradDestination as GradDestination
from minidist.tensor.autograd import grad

RNG = np.random.default_rng(0)


def leaf(*shape, dtype=np.float32):
    return Tensor(RNG.normal(size=shape).astype(dtype), requires_grad=True)


def reserve(t, scale=1.0):
    """A destination inside a larger flat buffer, the way DDP's buckets hold them."""
    flat = np.full(t.array.size + 8, 7.0, dtype=t.array.dtype)
    t.grad_destination = GradDestination(flat[4:4 + t.array.size].reshape(t.shape), scale)
    return flat


def peak_bytes(fn):
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("scale", [1.0, 0.5, 1 / 3])
def test_linear_writes_weight_and_bias_grads_into_their_destinations(scale):
    x = Tensor(RNG.normal(size=(5, 7)).astype(np.float32))
    w, b = leaf(3, 7), leaf(3)
    w2, b2 = Tensor(w.array, requires_grad=True), Tensor(b.array, requires_grad=True)
    flat_w, flat_b = reserve(w, scale), reserve(b, scale)
    linear(x, w, b).sum().backward()
    linear(x, w2, b2).sum().backward()
    assert w.grad.array is w.grad_destination.buffer and np.shares_memory(w.grad.array, flat_w)
    assert b.grad.array is b.grad_destination.buffer and np.shares_memory(b.grad, flat_b)
    assert (flat_w[:4] == 7).all() and (flat_w[-4:] == 7).all()   # nothing outside the slot
    np.testing.assert_allclose(w.grad, scale * w2.grad, rtol=1e-6)
    np.testing.assert_allclose(b.grad, scale * b2.grad, rtol=1e-6)


@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_no_gradient_is_allocated_then_copied(scale):
    # weight 512 x 512 float32 = 1 MiB; batch 2: every temporary of the backward is tiny
    x = Tensor(RNG.normal(size=(2, 512)).astype(np.float32))
    w, b = leaf(512, 512), leaf(512)
    out = linear(x, w, b).sum()
    reserve(w, scale), reserve(b, scale)
    peak = peak_bytes(out.backward)
    assert w.grad.array is w.grad_destination.buffer
    assert peak < w.array.nbytes // 8, peak        # allocate + copy would cost >= 1 MiB
    # the reference: without a destination the backward allocates the gradient
    w2 = Tensor(w.array, requires_grad=True)
    out = linear(x, w2).sum()
    assert peak_bytes(out.backward) >= w.array.nbytes


def test_conv_weight_grad_goes_into_its_destination():
    x = Tensor(RNG.normal(size=(2, 3, 6, 6)).astype(np.float32))
    w, b = leaf(4, 3, 3, 3), leaf(4)
    w2, b2 = Tensor(w.array, requires_grad=True), Tensor(b.array, requires_grad=True)
    flat = reserve(w, 0.5)
    reserve(b, 0.5)
    conv2d(x, w, b, stride=1, padding=1).sum().backward()
    conv2d(x, w2, b2, stride=1, padding=1).sum().backward()
    assert w.grad.array is w.grad_destination.buffer and np.shares_memory(w.grad, flat)
    np.testing.assert_allclose(w.grad, 0.5 * w2.grad, rtol=1e-5)
    np.testing.assert_allclose(b.grad, 0.5 * b2.grad, rtol=1e-5)


def test_existing_grad_accumulates_in_place_and_none_refills_the_destination():
    x = Tensor(RNG.normal(size=(5, 7)).astype(np.float32))
    w = leaf(3, 7)
    flat = reserve(w)
    linear(x, w).sum().backward()
    first = w.grad.array.copy()
    linear(x, w).sum().backward()                     # accumulates: same array, twice the value
    assert w.grad.array is w.grad_destination.buffer
    np.testing.assert_allclose(w.grad, 2 * first, rtol=1e-6)
    w.grad = None                                     # zero_grad(set_to_none=True)
    linear(x, w).sum().backward()
    assert w.grad.array is w.grad_destination.buffer and np.shares_memory(w.grad, flat)
    np.testing.assert_allclose(w.grad, first, rtol=1e-6)


def test_other_ops_copy_into_the_destination_scaled():
    w = leaf(4, 3)
    reserve(w, 0.25)
    (w * 2.0).exp().sum().backward()                  # elementwise: copied in, times the scale
    np.testing.assert_allclose(w.grad, 0.25 * 2 * np.exp(2 * w.array), rtol=1e-6)
    assert w.grad.array is w.grad_destination.buffer


@pytest.mark.parametrize("op", ["linear", "elementwise"])  # claimed in the op / stored by the walk
def test_grad_is_the_same_tensor_every_backward(op):
    x = Tensor(RNG.normal(size=(5, 7)).astype(np.float32))
    w = leaf(3, 7)
    reserve(w)
    run = (lambda: linear(x, w).sum().backward()) if op == "linear" else \
        (lambda: (w * 2.0).sum().backward())
    run()
    g = w.grad
    assert g is w.grad_destination.grad and g.array is w.grad_destination.buffer
    for _ in range(2):
        w.grad = None                                 # zero_grad(set_to_none=True)
        run()
        assert w.grad is g                            # no new Tensor per step (torch's bucket views)


def test_a_grad_tensor_moved_off_its_destination_is_not_reused():
    x = Tensor(RNG.normal(size=(5, 7)).astype(np.float32))
    w = leaf(3, 7)
    reserve(w)
    linear(x, w).sum().backward()
    expected = w.grad.array.copy()
    old = w.grad
    moved = np.full((3, 7), 5.0, np.float32)
    old.data = Tensor(moved)                          # torch's way to swap a gradient's storage
    assert w.grad.array is moved                      # adopted while it is w's gradient
    w.grad = None
    old.data = Tensor(moved)                          # and a stale Tensor moved after zero_grad
    linear(x, w).sum().backward()
    assert w.grad is not old and w.grad.array is w.grad_destination.buffer
    np.testing.assert_allclose(w.grad, expected, rtol=1e-6)
    assert (moved == 5.0).all()


def test_a_leaf_used_twice_gets_both_contributions():
    w = leaf(4, 4)
    w2 = Tensor(w.array, requires_grad=True)
    reserve(w, 0.5)
    (w @ w).sum().backward()                          # one op, the leaf on both sides
    (w2 @ w2).sum().backward()
    np.testing.assert_allclose(w.grad, 0.5 * w2.grad, rtol=1e-5)
    x = Tensor(RNG.normal(size=(3, 4)).astype(np.float32))
    w.grad, w2.grad = None, None
    (linear(linear(x, w), w).sum() + (w * w).sum()).backward()   # three ops, the same leaf
    (linear(linear(x, w2), w2).sum() + (w2 * w2).sum()).backward()
    np.testing.assert_allclose(w.grad, 0.5 * w2.grad, rtol=1e-5)


def test_float16_leaf_with_destination():
    x = Tensor(RNG.normal(size=(5, 7)).astype(np.float16))
    w = leaf(3, 7, dtype=np.float16)
    w2 = Tensor(w.array, requires_grad=True)
    reserve(w, 0.5)
    linear(x, w).sum().backward()
    linear(x, w2).sum().backward()
    assert w.grad.dtype == np.float16 and w.grad.array is w.grad_destination.buffer
    np.testing.assert_allclose(w.grad, 0.5 * w2.grad.astype(np.float32), rtol=2e-3)


def test_autograd_grad_does_not_touch_destinations():
    x = Tensor(RNG.normal(size=(5, 7)).astype(np.float32))
    w = leaf(3, 7)
    flat = reserve(w)
    (gw,) = grad(linear(x, w).sum(), [w])
    assert w.grad is None and (flat == 7).all() and not np.shares_memory(gw, flat)


def test_a_failed_autograd_grad_leaves_backward_writing_in_place():
    # grad() turns the in-place writes off while it walks, and on again even when it raises
    x = Tensor(RNG.normal(size=(2, 512)).astype(np.float32))
    w = leaf(512, 512)
    reserve(w)
    used = linear(x, w).sum()
    used.backward()
    with pytest.raises(RuntimeError, match="second time"):
        grad(used, [w])  # the graph was freed by that backward
    w.grad = None
    out = linear(x, w).sum()
    assert peak_bytes(out.backward) < w.array.nbytes // 8  # the GEMM wrote into the buffer
    assert w.grad.array is w.grad_destination.buffer


def test_bad_destinations_are_refused():
    w = leaf(3, 4)
    with pytest.raises(ValueError, match="shape"):
        w.grad_destination = GradDestination(np.zeros((4, 3), np.float32))
    with pytest.raises(ValueError, match="C-contiguous"):
        GradDestination(np.zeros((4, 3), np.float32).T)
    with pytest.raises(ValueError, match="float"):
        GradDestination(np.zeros(3, np.int64))
    with pytest.raises(TypeError, match="GradDestination"):
        w.grad_destination = np.zeros((3, 4), np.float32)
    with pytest.raises(RuntimeError, match="leaf"):
        (w * 2).grad_destination = GradDestination(np.zeros((3, 4), np.float32))
    w.grad_destination = None                         # released: backward allocates again
    (w * 2).sum().backward()
    assert w.grad is not None
