"""torch.utils.checkpoint's keyword arguments: use_reentrant, preserve_rng_state, ... are
checkpoint's own and never reach the function (compared with torch when installed)."""

import numpy as np
import pytest

import minidist
from minidist import nn
from minidist.utils import checkpoint, checkpoint_sequential


def f(x, scale=1.0):
    return (x * scale).tanh()


@pytest.mark.parametrize("use_reentrant", [False, True, None])
def test_use_reentrant_is_not_passed_to_the_function(use_reentrant):
    x = minidist.ones(2, requires_grad=True)
    y = checkpoint(f, x, use_reentrant=use_reentrant, scale=2.0, preserve_rng_state=False)
    y.sum().backward()
    np.testing.assert_allclose(x.grad, 2.0 * (1 - np.tanh(2.0) ** 2), rtol=1e-6)


def test_module_and_sequential_with_torch_kwargs():
    block = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 1))
    x = minidist.randn(4, 3)
    checkpoint(block, x, use_reentrant=False, determinism_check="default",
               early_stop=True).sum().backward()
    assert block[0].weight.grad is not None
    checkpoint_sequential(block, 2, x, use_reentrant=False, preserve_rng_state=True)
    with pytest.raises(ValueError, match="context_fn"):
        checkpoint(block, x, use_reentrant=False, context_fn=lambda: (None, None))


def test_gradients_match_torch():
    torch = pytest.importorskip("torch")
    from torch.utils.checkpoint import checkpoint as tcheckpoint

    a = np.linspace(-1, 1, 6).reshape(2, 3).astype(np.float64)
    x = minidist.tensor(a, requires_grad=True)
    tx = torch.tensor(a, requires_grad=True)
    checkpoint(f, x, use_reentrant=False, scale=3.0).sum().backward()
    tcheckpoint(lambda t, scale: (t * scale).tanh(), tx, use_reentrant=False,
                scale=3.0).sum().backward()
    np.testing.assert_allclose(x.grad, tx.grad.numpy(), rtol=1e-12)
