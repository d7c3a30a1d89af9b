"""Activation checkpointing (minidist.utils.checkpoint): same gradients, less memory kept.

One process; the DDP cases (hooks once per parameter, no_sync) run under mpiexec in
tests/ddp/test_zero_mpi.py.
"""

import numpy as np
import pytest

from minidist import nn
from minidist.tensor import Tensor, no_grad, random
from minidist.utils import checkpoint, checkpoint_sequential, memory_report


def mlp(blocks=4, width=16, p_drop=0.0):
    nn.manual_seed(0)
    layers = []
    for _ in range(blocks):
        layers += [nn.Linear(width, width, dtype=np.float64), nn.GELU()]
        if p_drop:
            layers.append(nn.Dropout(p_drop))
    return nn.Sequential(*layers)


def grads(model, forward, seed=1):
    model.zero_grad() if hasattr(model, "zero_grad") else None
    for p in model.parameters():
        p.grad = None
    x = Tensor(np.random.default_rng(0).normal(size=(8, 16)), requires_grad=True)
    nn.manual_seed(seed)  # the dropout masks
    forward(model, x).sum().backward()
    return [p.grad.array.copy() for p in model.parameters() if p.grad is not None] + [x.grad.array.copy()]


@pytest.mark.parametrize("p_drop", [0.0, 0.3])
def test_checkpoint_sequential_gradients_are_bit_identical(p_drop):
    model = mlp(p_drop=p_drop)
    plain = grads(model, lambda m, x: m(x))
    for segments in (1, 2, len(model)):
        ckpt = grads(model, lambda m, x: checkpoint_sequential(m, segments, x))
        for a, b in zip(plain, ckpt):
            assert np.array_equal(a, b), segments


def test_checkpoint_of_a_closure_and_a_shared_parameter_fires_hooks_once():
    model = mlp(blocks=2)
    fired = []
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(lambda t: fired.append(id(t)))
    first = model[0]

    def f(x):  # a closure over a module; `first` is used again outside the checkpoint
        return first(x).tanh()

    def fwd(m, x):
        return first(checkpoint(f, x)) * 2.0

    plain = grads(model, lambda m, x: first(f(x)) * 2.0)
    fired.clear()
    ckpt = grads(model, fwd)
    for a, b in zip(plain, ckpt):
        assert np.array_equal(a, b)
    assert sorted(fired) == sorted(id(p) for p in first.parameters())  # once each


def test_rng_stream_after_backward_is_unchanged():
    model = mlp(p_drop=0.5)
    x = Tensor(np.ones((4, 16)), requires_grad=True)
    nn.manual_seed(3)
    out = checkpoint_sequential(model, 2, x)
    after_forward = random.default_generator().bit_generator.state
    out.sum().backward()
    assert random.default_generator().bit_generator.state == after_forward


def test_mutating_the_input_is_refused():
    lin = nn.Linear(16, 16, dtype=np.float64)
    x = Tensor(np.ones((2, 16)), requires_grad=True)

    def bad(t):
        t.array += 1.0
        return lin(t)

    with pytest.raises(RuntimeError, match="modified in place during the checkpointed forward"):
        checkpoint(bad, x)
    y = checkpoint(lin, x)
    x.array[0, 0] = 5.0  # changed between forward and backward
    with pytest.raises(RuntimeError, match="between the checkpointed forward and its backward"):
        y.sum().backward()


def test_a_parameter_that_cannot_be_found_is_an_error_not_a_lost_gradient():
    hidden = {"lin": nn.Linear(16, 16, dtype=np.float64)}

    def f(x):  # reaches the module through a dict: not discoverable
        return hidden["lin"](x)

    y = checkpoint(f, Tensor(np.ones((2, 16)), requires_grad=True))
    with pytest.raises(RuntimeError, match="could not be found from the function"):
        y.sum().backward()


def test_under_no_grad_it_is_a_plain_call_and_a_non_tensor_output_is_refused():
    lin = nn.Linear(16, 16, dtype=np.float64)
    with no_grad():
        assert not checkpoint(lin, Tensor(np.ones((2, 16)))).requires_grad
    with pytest.raises(TypeError, match="return one Tensor"):
        checkpoint(lambda x: (lin(x), x), Tensor(np.ones((2, 16)), requires_grad=True))
    with pytest.raises(ValueError, match="segments=0"):
        checkpoint_sequential(mlp(), 0, Tensor(np.ones((2, 16))))


def test_checkpointing_every_block_keeps_less_activation_memory():
    nn.manual_seed(0)
    layers = []  # 6 transformer-style MLP blocks: width -> 4 x width -> width
    for _ in range(6):
        layers += [nn.Linear(32, 128, dtype=np.float64), nn.GELU(),
                   nn.Linear(128, 32, dtype=np.float64)]
    model = nn.Sequential(*layers)
    x = Tensor(np.random.default_rng(0).normal(size=(256, 32)), requires_grad=True)

    def step(fwd):
        return lambda: fwd(x).sum()  # the loss: memory_report measures, then runs backward

    plain = memory_report(model, step=step(model))
    ckpt = memory_report(model, step=step(lambda t: checkpoint_sequential(model, 6, t)))
    assert ckpt.activations_kept < plain.activations_kept / 3, (ckpt, plain)
    assert ckpt.peak_activations < plain.peak_activations / 2, (ckpt, plain)
    assert all(p.grad is not None for p in model.parameters())  # backward ran
    assert ckpt.parameters == sum(p.array.nbytes for p in model.parameters())


def test_docstring_examples_run():
    import doctest

    import minidist.tensor.checkpoint as mechanism
    import minidist.utils.checkpointing as checkpointing
    import minidist.utils.memory as memory
    for module in (mechanism, checkpointing, memory):
        assert doctest.testmod(module).failed == 0, module.__name__


def test_autograd_grad_returns_gradients_without_accumulating_or_hooks():
    from minidist.tensor.autograd import grad
    w = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    other = Tensor(np.array([3.0, 4.0]), requires_grad=True)
    fired = []
    w.register_post_accumulate_grad_hook(lambda t: fired.append(t))
    (gw,) = grad((w * w + w * other).sum(), [w])
    assert np.array_equal(gw, 2 * w.array + other.array)
    assert w.grad is None and other.grad is None and not fired
