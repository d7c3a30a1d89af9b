"""Module-level flatten, cat, stack, topk, multinomial and in-place indexing writes, as torch's
(minGPT's ``generate`` needs the last four); checked against torch when it is installed."""

import numpy as np
import pytest

import minidist
from minidist.tensor import Tensor


def test_cat_stack_flatten_take_dim():
    a, b = minidist.ones(2, 3), minidist.zeros(2, 3)
    assert minidist.cat((a, b), dim=1).shape == (2, 6) and minidist.cat([a, b]).shape == (4, 3)
    assert minidist.stack([a, b], dim=2).shape == (2, 3, 2)
    assert minidist.flatten(minidist.ones(2, 3, 4), 1).shape == (2, 12)
    assert minidist.flatten(minidist.ones(2, 3, 4), 0, 1).shape == (6, 4)
    x = minidist.ones(2, 3, requires_grad=True)
    minidist.cat((x, x * 2), dim=1).sum().backward()
    np.testing.assert_array_equal(x.grad, np.full((2, 3), 3.0))


def test_topk_values_indices_and_gradient():
    x = minidist.tensor([[1.0, 5.0, 3.0], [4.0, 2.0, 6.0]], requires_grad=True)
    v, i = minidist.topk(x, 2)
    assert v.tolist() == [[5.0, 3.0], [6.0, 4.0]] and i.tolist() == [[1, 2], [2, 0]]
    (v * minidist.tensor([[1.0, 10.0]])).sum().backward()
    np.testing.assert_array_equal(x.grad, [[0, 1, 10], [10, 0, 1]])
    small = x.topk(1, dim=0, largest=False)
    assert small.values.tolist() == [[1.0, 2.0, 3.0]] and small.indices.dtype == np.int64
    with pytest.raises(ValueError, match="k=4"):
        minidist.topk(x, 4)


def test_multinomial_draws_from_the_weights():
    minidist.manual_seed(0)
    probs = minidist.tensor([[0.0, 1.0, 0.0], [0.2, 0.0, 0.8]])
    draws = minidist.multinomial(probs, 2000, replacement=True)
    assert draws.shape == (2, 2000) and draws.dtype == np.int64
    assert set(draws[0].tolist()) == {1}
    assert abs((draws[1].numpy() == 2).mean() - 0.8) < 0.05
    once = minidist.multinomial(minidist.tensor([1.0, 1.0, 1.0]), 3)
    assert sorted(once.tolist()) == [0, 1, 2]          # without replacement: each once
    with pytest.raises(ValueError, match="without replacement"):
        minidist.multinomial(probs, 2)
    with pytest.raises(ValueError, match=">= 0"):
        minidist.multinomial(minidist.tensor([-1.0, 2.0]), 1)


def test_setitem_writes_in_place_outside_the_tape():
    logits = minidist.tensor([[1.0, 5.0, 3.0]])
    v, _ = minidist.topk(logits, 2)
    logits[logits < v[:, [-1]]] = -float("inf")        # minGPT's top-k filter
    assert logits.tolist() == [[-float("inf"), 5.0, 3.0]]
    w = minidist.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError, match="no_grad"):
        w[0] = 3.0
    with minidist.no_grad():
        w[0] = 3.0
    assert w.tolist() == [3.0, 1.0]


def test_generate_loop_of_mingpt_runs():
    minidist.manual_seed(0)
    idx = minidist.zeros(2, 1, dtype=minidist.long)
    with minidist.no_grad():
        for _ in range(4):
            logits = minidist.randn(2, 1, 7)[:, -1, :] / 0.8
            v, _ = minidist.topk(logits, 3)
            logits[logits < v[:, [-1]]] = -float("Inf")
            probs = minidist.nn.functional.softmax(logits, dim=-1)
            idx_next = minidist.multinomial(probs, num_samples=1)
            idx = minidist.cat((idx, idx_next), dim=1)
    assert idx.shape == (2, 5) and idx.dtype == np.int64


def test_against_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 5, 4)).astype(np.float32)
    for dim, largest in [(1, True), (-1, False), (0, True)]:
        k = 2
        tx = torch.from_numpy(x).requires_grad_()
        tv, ti = torch.topk(tx, k, dim=dim, largest=largest)
        mx = Tensor(x, requires_grad=True)
        mv, mi = minidist.topk(mx, k, dim=dim, largest=largest)
        np.testing.assert_array_equal(mv.numpy(), tv.detach().numpy())
        np.testing.assert_array_equal(mi.numpy(), ti.numpy())
        gg = rng.normal(size=tv.shape).astype(np.float32)
        tv.backward(torch.from_numpy(gg))
        mv.backward(gg)
        np.testing.assert_allclose(mx.grad, tx.grad.numpy())
    np.testing.assert_array_equal(minidist.cat([Tensor(x), Tensor(x)], dim=2).numpy(),
                                  torch.cat([torch.from_numpy(x)] * 2, dim=2).numpy())
    np.testing.assert_array_equal(minidist.stack([Tensor(x), Tensor(x)], dim=1).numpy(),
                                  torch.stack([torch.from_numpy(x)] * 2, dim=1).numpy())
    np.testing.assert_array_equal(minidist.flatten(Tensor(x), 1).numpy(),
                                  torch.flatten(torch.from_numpy(x), 1).numpy())
    t = torch.multinomial(torch.tensor([[0.0, 1.0], [1.0, 0.0]]), 1)
    m = minidist.multinomial(minidist.tensor([[0.0, 1.0], [1.0, 0.0]]), 1)
    assert m.tolist() == t.tolist() and m.dtype == np.int64 and t.dtype == torch.int64
