"""The autograd engine: in-place accumulation (contract 1), post-accumulate-grad hooks
(contract 2), end-of-backward callbacks, tape freeing, no_grad, backward errors."""

import gc
import weakref

import numpy as np
import pytest

from minidist.tensor import (Tensor, enable_grad, is_grad_enabled, linear, no_grad,
                             queue_callback)


def mlp(rng, dtype=np.float32):
    sizes = [(8, 6), (6, 5), (5, 3)]
    params = []
    for i, o in sizes:
        params += [Tensor(rng.standard_normal((o, i)).astype(dtype), requires_grad=True),
                   Tensor(rng.standard_normal(o).astype(dtype), requires_grad=True)]
    return params


def forward(params, x):
    h = x
    for k in range(0, len(params), 2):
        h = linear(h, params[k], params[k + 1])
        if k + 2 < len(params):
            h = h.relu()
    return (h * h).mean()


# ---- contract 1: accumulate in place, never rebind ----------------------------------------

def test_backward_accumulates_into_a_view_of_a_flat_buffer():
    flat = np.zeros(10, dtype=np.float32)
    w = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3), requires_grad=True)
    view = flat[0:6].reshape(2, 3)
    w.grad = view
    x = Tensor(np.ones((4, 2), dtype=np.float32))
    for _ in range(2):
        (x @ w).sum().backward()
    assert w.grad.array is view and np.shares_memory(w.grad.array, flat)
    np.testing.assert_allclose(flat[:6].reshape(2, 3), 2 * 4 * np.ones((2, 3)))
    np.testing.assert_array_equal(flat[6:], 0)


def test_first_backward_allocates_a_grad_of_the_params_shape_and_dtype():
    w = Tensor(np.ones((2, 3), dtype=np.float32), requires_grad=True)
    (w * 3.0).sum().backward()
    assert w.grad.shape == (2, 3) and w.grad.dtype == np.float32
    first = w.grad
    (w * 3.0).sum().backward()
    assert w.grad is first
    np.testing.assert_allclose(w.grad, 6.0)


def test_grad_of_another_dtype_is_cast_into_the_buffer():
    w = Tensor(np.ones(4, dtype=np.float16), requires_grad=True)  # fp16 param, fp32 grad buffer
    buf = np.zeros(4, dtype=np.float32)
    w.grad = buf
    (w * 0.5).sum().backward()
    assert w.grad.array is buf and buf.dtype == np.float32
    np.testing.assert_allclose(buf, 0.5)


def test_leaves_without_requires_grad_get_nothing():
    w = Tensor(np.ones(3), requires_grad=True)
    c = Tensor(np.ones(3))
    (w * c).sum().backward()
    assert c.grad is None and w.grad is not None


def test_grad_setter_checks_the_shape():
    w = Tensor(np.ones((2, 3)), requires_grad=True)
    with pytest.raises(ValueError, match=r"gradient of shape \(3, 2\) to a tensor of shape \(2, 3\)"):
        w.grad = np.zeros((3, 2))


# ---- contract 2: post-accumulate-grad hooks -------------------------------------------------

def test_hooks_fire_once_per_leaf_last_layer_first():
    rng = np.random.default_rng(0)
    params = mlp(rng)
    names = ["w1", "b1", "w2", "b2", "w3", "b3"]
    fired = []
    for name, p in zip(names, params):
        p.register_post_accumulate_grad_hook(lambda t, name=name: fired.append(name))
    x = Tensor(rng.standard_normal((4, 8)).astype(np.float32))
    forward(params, x).backward()
    assert fired == ["b3", "w3", "b2", "w2", "b1", "w1"]  # exactly reverse parameter order
    fired.clear()
    forward(params, x).backward()
    assert fired == ["b3", "w3", "b2", "w2", "b1", "w1"]


def test_hook_sees_the_complete_grad_of_a_param_used_twice():
    w = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    seen = []
    w.register_post_accumulate_grad_hook(lambda t: seen.append(t.grad.array.copy()))
    x = Tensor(np.array([3.0, 4.0]), requires_grad=True)
    # w feeds two different ops, far apart in the graph: the hook fires once, after both
    loss = ((w * x).sum() * 2.0).exp() * 0.0 + (w * x).sum() * 2.0 + (w * w).sum()
    loss.backward()
    assert len(seen) == 1
    np.testing.assert_allclose(seen[0], 2 * x.array + 2 * w.array)
    np.testing.assert_allclose(seen[0], w.grad)


def test_hook_fires_for_x_times_x_once():
    w = Tensor(np.array([3.0]), requires_grad=True)
    calls = []
    w.register_post_accumulate_grad_hook(lambda t: calls.append(t.grad.array.copy()))
    (w * w).sum().backward()
    assert len(calls) == 1 and calls[0][0] == 6.0


def test_hook_order_tracks_completion_not_registration():
    a = Tensor(np.ones(2), requires_grad=True)
    b = Tensor(np.ones(2), requires_grad=True)
    order = []
    a.register_post_accumulate_grad_hook(lambda t: order.append("a"))
    b.register_post_accumulate_grad_hook(lambda t: order.append("b"))
    # b is consumed last in the forward, so it is finished first in the backward
    ((a * 2.0).exp().sum() * b).sum().backward()
    assert order == ["b", "a"]


def test_hook_removal_no_grad_and_non_leaves():
    w = Tensor(np.ones(2), requires_grad=True)
    calls = []
    handle = w.register_post_accumulate_grad_hook(lambda t: calls.append(1))
    with no_grad():
        y = (w * 2.0).sum()
    assert not y.requires_grad
    with pytest.raises(RuntimeError, match="does not require grad"):
        y.backward()
    assert calls == []
    (w * 2.0).sum().backward()
    assert calls == [1]
    handle.remove()
    handle.remove()  # idempotent
    (w * 2.0).sum().backward()
    assert calls == [1]
    with pytest.raises(RuntimeError, match="only be registered on leaf tensors"):
        (w * 2.0).register_post_accumulate_grad_hook(lambda t: None)


def test_backward_on_a_leaf_fires_its_hook():
    w = Tensor(np.array(2.0), requires_grad=True)
    calls = []
    w.register_post_accumulate_grad_hook(lambda t: calls.append(float(t.grad)))
    w.backward()
    assert calls == [1.0]


# ---- end-of-backward callbacks -------------------------------------------------------------

def test_queued_callback_runs_once_after_every_hook():
    rng = np.random.default_rng(0)
    params = mlp(rng)
    events = []

    def hook(t, k):
        events.append(("hook", k))
        if k == len(params) - 1:  # the first hook to fire (last layer's bias) queues it
            queue_callback(lambda: events.append(("end", all(p.grad is not None
                                                             for p in params))))
    for k, p in enumerate(params):
        p.register_post_accumulate_grad_hook(lambda t, k=k: hook(t, k))
    forward(params, Tensor(rng.standard_normal((4, 8)).astype(np.float32))).backward()
    assert [e[0] for e in events] == ["hook"] * len(params) + ["end"]
    assert events[-1] == ("end", True)
    # the next backward starts with an empty queue: nothing runs twice
    events.clear()
    forward(params, Tensor(rng.standard_normal((4, 8)).astype(np.float32))).backward()
    assert [e[0] for e in events] == ["hook"] * len(params) + ["end"]


def test_callbacks_run_in_order_and_may_queue_more():
    w = Tensor(np.ones(3), requires_grad=True)
    order = []

    def second():
        order.append(2)
        queue_callback(lambda: order.append(3))
    w.register_post_accumulate_grad_hook(
        lambda t: (queue_callback(lambda: order.append(1)), queue_callback(second)))
    (w * 2.0).sum().backward()
    assert order == [1, 2, 3]


def test_callback_errors_propagate_and_a_failed_backward_drops_its_callbacks():
    w = Tensor(np.ones(3), requires_grad=True)

    def boom():
        raise ValueError("end of backward check failed")
    handle = w.register_post_accumulate_grad_hook(lambda t: queue_callback(boom))
    with pytest.raises(ValueError, match="check failed"):
        (w * 2.0).sum().backward()
    handle.remove()
    ran = []
    w.register_post_accumulate_grad_hook(lambda t: (queue_callback(lambda: ran.append(1)),
                                                    1 / 0))
    with pytest.raises(ZeroDivisionError):
        (w * 2.0).sum().backward()
    assert ran == []
    with pytest.raises(RuntimeError, match="no backward is running"):
        queue_callback(lambda: None)  # the failed backward left no frame behind


def test_a_backward_inside_a_hook_runs_only_its_own_callbacks():
    w = Tensor(np.ones(2), requires_grad=True)
    v = Tensor(np.ones(2), requires_grad=True)
    order = []

    def w_hook(t):
        queue_callback(lambda: order.append("outer"))
        v.register_post_accumulate_grad_hook(
            lambda t: queue_callback(lambda: order.append("inner")))
        (v * 3.0).sum().backward()
        order.append("inner backward returned")
    w.register_post_accumulate_grad_hook(w_hook)
    (w * 2.0).sum().backward()
    assert order == ["inner", "inner backward returned", "outer"]


def test_queue_callback_outside_backward_explains():
    with pytest.raises(RuntimeError, match="no backward is running on this thread"):
        queue_callback(lambda: None)


# ---- the tape -----------------------------------------------------------------------------

def test_tape_is_freed_after_backward():
    w = Tensor(np.ones((3, 3)), requires_grad=True)
    hidden = (w * 2.0).exp()
    ref = weakref.ref(hidden)
    loss = hidden.sum()
    del hidden
    gc.collect()
    assert ref() is not None  # held by loss's closure/parents until backward
    loss.backward()
    gc.collect()
    assert ref() is None and loss._parents == ()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        loss.backward()


def test_retain_graph_allows_a_second_backward():
    w = Tensor(np.ones(3), requires_grad=True)
    loss = (w * w).sum()
    loss.backward(retain_graph=True)
    loss.backward()
    np.testing.assert_allclose(w.grad, 4.0)


def test_backward_with_explicit_gradient():
    w = Tensor(np.ones((2, 2)), requires_grad=True)
    (w * 3.0).backward(np.full((2, 2), 2.0))
    np.testing.assert_allclose(w.grad, 6.0)
    with pytest.raises(ValueError, match=r"gradient has shape \(3,\) but the tensor has shape"):
        (w * 3.0).backward(np.ones(3))


def test_backward_on_non_scalar_explains_the_fix():
    w = Tensor(np.ones((3, 4)), requires_grad=True)
    with pytest.raises(ValueError, match=r"backward: called on a tensor of shape \(3, 4\); backward "
                                         r"needs a scalar loss \(call \.sum\(\) or \.mean\(\) first\) "
                                         r"or pass gradient=\.\.\."):
        (w * 2.0).backward()


def test_deep_graph_does_not_hit_the_recursion_limit():
    w = Tensor(np.ones(2), requires_grad=True)
    h = w
    for _ in range(5000):
        h = h * 1.0
    h.sum().backward()
    np.testing.assert_allclose(w.grad, 1.0)


def test_intermediate_tensors_keep_no_grad():
    w = Tensor(np.ones(2), requires_grad=True)
    h = w * 2.0
    (h * h).sum().backward()
    assert h.grad is None and not h.is_leaf and w.is_leaf


# ---- grad mode ----------------------------------------------------------------------------

def test_no_grad_restores_mode_even_after_an_error():
    assert is_grad_enabled()
    with pytest.raises(KeyError):
        with no_grad():
            assert not is_grad_enabled()
            raise KeyError("x")
    assert is_grad_enabled()
    with no_grad():
        with enable_grad():
            assert is_grad_enabled()
        assert not is_grad_enabled()

    @no_grad()
    def f(t):
        return t * 2.0

    assert not f(Tensor(np.ones(2), requires_grad=True)).requires_grad
    assert is_grad_enabled()


def test_detach_shares_data_and_leaves_the_tape():
    w = Tensor(np.ones(2), requires_grad=True)
    d = (w * 2.0).detach()
    assert not d.requires_grad and d.is_leaf
    e = w.detach()
    assert e.array is w.array


def test_leaves_never_share_gradient_memory():
    """A fresh gradient may be adopted by ONE leaf; a shared one (add's (g, g), a pass-through
    of a gradient that also went elsewhere, a view) is copied, so later accumulation into one
    leaf's grad can never change another's."""
    import numpy as np

    from minidist.tensor import Tensor

    a = Tensor(np.ones((2, 3)), requires_grad=True)
    b = Tensor(np.ones((2, 3)), requires_grad=True)
    c = Tensor(np.ones((3, 2)), requires_grad=True)
    for _ in range(2):  # the second pass accumulates into whatever the first one left
        s = a + (b + 0.0) + c.T      # (g, g) at the outer add; b gets g through a pass-through
        (s * s).sum().backward()      # d/dx of sum((a+b+c.T)^2) = 2*(a+b+c.T) = 6 everywhere
    grads = [a.grad, b.grad, c.grad]
    for i, x in enumerate(grads):
        for y in grads[i + 1:]:
            assert not np.shares_memory(x, y)
    np.testing.assert_array_equal(a.grad, np.full((2, 3), 12.0))
    np.testing.assert_array_equal(b.grad, np.full((2, 3), 12.0))
    np.testing.assert_array_equal(c.grad, np.full((3, 2), 12.0))


def test_a_fresh_gradient_is_adopted_without_a_copy():
    """Linear's weight gradient is a new matmul result: the leaf takes it as it is, so backward
    holds one weight-sized array at its peak, not two (the result and a copy of it)."""
    import tracemalloc

    import numpy as np

    from minidist import nn
    from minidist.tensor import Tensor

    layer = nn.Linear(1024, 1024, bias=False)             # weight and its grad: 4 MiB each
    x = Tensor(np.ones((2, 1024), np.float32))
    loss = layer(x).sum()
    tracemalloc.start()
    loss.backward()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    weight_bytes = layer.weight.array.nbytes
    assert peak < 1.5 * weight_bytes, f"backward peaked at {peak} bytes for a {weight_bytes}-byte grad"
    np.testing.assert_allclose(layer.weight.grad, np.full((1024, 1024), 2.0))
