"""Ops a small GPT needs (tril/triu, masked_fill, split, torch's transpose, softmax(dim=),
scaled_dot_product_attention, MultiheadAttention, Embedding(padding_idx)) and the nn gaps
(Dropout2d, AvgPool2d, AdaptiveAvgPool2d, cross_entropy's ignore_index / label_smoothing /
weight / probability targets): float64 finite differences and reference formulas, plus
optional parity with torch."""

import numpy as np
import pytest

import minidist
from minidist import Tensor, nn
from minidist.nn import functional as F
from test_tensor import gradcheck

RNG = np.random.default_rng(7)


def test_tril_triu_masked_fill_split_transpose_gradients():
    x = RNG.standard_normal((2, 4, 4))
    np.testing.assert_array_equal(minidist.tensor.tril(Tensor(x)).array, np.tril(x))
    np.testing.assert_array_equal(Tensor(x).triu(1).array, np.triu(x, 1))
    gradcheck(lambda t: t.tril(-1) * 2 + t.triu(1), x)
    mask = np.tril(np.ones((4, 4), bool))
    gradcheck(lambda t: t.masked_fill(~mask, -3.0).exp(), x)
    out = Tensor(x).masked_fill(Tensor(~mask), float("-inf"))
    assert np.isinf(out.array[0, 0, 1]) and out.array[0, 1, 0] == x[0, 1, 0]
    gradcheck(lambda t: t.split(3, dim=2)[1] * 5, RNG.standard_normal((2, 2, 7)))
    assert [p.shape[1] for p in Tensor(np.zeros((2, 7))).split([3, 4], 1)] == [3, 4]
    assert [p.shape[0] for p in Tensor(np.zeros(7)).chunk(3)] == [3, 3, 1]
    y = RNG.standard_normal((2, 3, 4, 5))
    assert Tensor(y).transpose(1, 2).shape == (2, 4, 3, 5)
    assert Tensor(y).permute(0, 2, 1, 3).shape == (2, 4, 3, 5)
    gradcheck(lambda t: t.transpose(1, 3).contiguous().view(2, -1), y)
    with pytest.raises(TypeError, match="mask must be a bool tensor"):
        Tensor(x).masked_fill(np.ones((4, 4)), 0.0)


def test_batched_matmul_and_softmax_dim_gradients():
    a, b = RNG.standard_normal((2, 3, 4, 5)), RNG.standard_normal((2, 3, 5, 2))
    gradcheck(lambda s, t: s @ t, a, b)
    gradcheck(lambda s: F.softmax(s, dim=-2), a)
    gradcheck(lambda s: s.softmax(dim=1), a)


def reference_attention(q, k, v, allowed=None, scale=None):
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ np.swapaxes(k, -1, -2) * scale
    if allowed is not None:
        s = np.where(allowed, s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)) @ v


def test_scaled_dot_product_attention_matches_formula_and_gradients():
    q, k, v = (RNG.standard_normal((2, 3, 5, 4)) for _ in range(3))
    causal = np.tril(np.ones((5, 5), bool))
    got = F.scaled_dot_product_attention(Tensor(q), Tensor(k), Tensor(v), is_causal=True)
    np.testing.assert_allclose(got.array, reference_attention(q, k, v, causal), rtol=1e-12)
    got = F.scaled_dot_product_attention(Tensor(q), Tensor(k), Tensor(v), attn_mask=causal)
    np.testing.assert_allclose(got.array, reference_attention(q, k, v, causal), rtol=1e-12)
    gradcheck(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True), q, k, v)
    bias = RNG.standard_normal((5, 5))
    gradcheck(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, attn_mask=bias, scale=0.3),
              q, k, v)
    with pytest.raises(ValueError, match="both attn_mask and is_causal"):
        F.scaled_dot_product_attention(Tensor(q), Tensor(k), Tensor(v), causal, is_causal=True)


def test_multihead_attention_keys_shapes_formula_and_gradients():
    minidist.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=True).double()
    assert list(mha.state_dict()) == ["in_proj_weight", "in_proj_bias", "out_proj.weight",
                                      "out_proj.bias"]
    x = RNG.standard_normal((3, 5, 8))
    mask = np.triu(np.ones((5, 5), bool), 1)                     # True = not allowed (torch MHA)
    out, w = mha(Tensor(x), Tensor(x), Tensor(x), attn_mask=mask)
    assert out.shape == (3, 5, 8) and w.shape == (3, 5, 5)
    W, b = mha.in_proj_weight.array, mha.in_proj_bias.array
    q, k, v = np.split(x @ W.T + b, 3, axis=-1)
    heads = [reference_attention(*(t[..., h * 4:(h + 1) * 4] for t in (q, k, v)), ~mask)
             for h in range(2)]
    want = np.concatenate(heads, -1) @ mha.out_proj.weight.array.T + mha.out_proj.bias.array
    np.testing.assert_allclose(out.array, want, rtol=1e-10)
    np.testing.assert_allclose(w.array.sum(-1), 1.0)
    mha_sf = nn.MultiheadAttention(8, 2).double()
    mha_sf.load_state_dict(mha.state_dict())
    y, none = mha_sf(Tensor(x.transpose(1, 0, 2)), Tensor(x.transpose(1, 0, 2)),
                     Tensor(x.transpose(1, 0, 2)), need_weights=False, attn_mask=mask)
    assert none is None
    np.testing.assert_allclose(y.array.transpose(1, 0, 2), want, rtol=1e-10)
    x1 = x[:2, :3]
    pad = np.array([[False, False, True], [False, False, False]])
    gradcheck(lambda t: mha(t, t, t, key_padding_mask=pad)[0], x1)
    params = [mha.in_proj_weight, mha.in_proj_bias, mha.out_proj.weight]
    out, _ = mha(Tensor(x1), Tensor(x1), Tensor(x1), attn_mask=mask[:3, :3])
    (out * Tensor(RNG.standard_normal(out.shape))).sum().backward()
    assert all(p.grad is not None and np.abs(p.grad.array).sum() > 0 for p in params)


def test_embedding_padding_idx_gets_no_gradient():
    emb = nn.Embedding(5, 3, padding_idx=0)
    assert np.all(emb.weight.array[0] == 0)
    idx = np.array([[0, 2, 2], [1, 0, 4]])
    emb(idx).sum().backward()
    assert np.all(emb.weight.grad[0] == 0)
    np.testing.assert_array_equal(emb.weight.grad[:, 0], [0, 1, 2, 0, 1])
    assert nn.Embedding(5, 3, padding_idx=-1).padding_idx == 4


def test_dropout2d_zeroes_whole_channels():
    minidist.manual_seed(0)
    x = Tensor(np.ones((4, 8, 3, 3)), requires_grad=True)
    y = nn.Dropout2d(0.5)(x)
    per_channel = y.array.reshape(4, 8, 9)
    assert np.all((per_channel == 0).all(-1) | (per_channel == 2.0).all(-1))
    assert 0 < (per_channel[..., 0] == 0).sum() < 32
    y.sum().backward()
    np.testing.assert_array_equal(x.grad, y.array)
    assert nn.Dropout2d(0.5).eval()(x) is x


def test_avg_pool2d_and_adaptive_avg_pool2d():
    x = RNG.standard_normal((2, 3, 6, 7))
    got = nn.AvgPool2d(2)(Tensor(x)).array
    np.testing.assert_allclose(got, x[:, :, :6, :6].reshape(2, 3, 3, 2, 3, 2).mean((3, 5)))
    gradcheck(lambda t: F.avg_pool2d(t, 3, stride=2, padding=1), x)
    gradcheck(lambda t: F.avg_pool2d(t, 3, 2, 1, count_include_pad=False), x)
    np.testing.assert_allclose(nn.AdaptiveAvgPool2d(1)(Tensor(x)).array[..., 0, 0],
                               x.mean((2, 3)))
    got = nn.AdaptiveAvgPool2d((4, 3))(Tensor(x)).array          # uneven, overlapping bins
    np.testing.assert_allclose(got[:, :, 1, 2], x[:, :, 1:3, 4:7].mean((2, 3)))
    gradcheck(lambda t: F.adaptive_avg_pool2d(t, (4, 3)), x)
    gradcheck(lambda t: F.adaptive_avg_pool2d(t, (None, 2)), RNG.standard_normal((1, 2, 3, 4)))


def test_cross_entropy_ignore_index_label_smoothing_weight_and_probabilities():
    x = RNG.standard_normal((6, 4))
    t = np.array([0, 3, -100, 1, 1, 2])
    w = np.array([1.0, 2.0, 0.5, 1.5])
    logp = x - np.log(np.exp(x).sum(1, keepdims=True))
    kept = t != -100
    eps = 0.2
    for weight in (None, w):
        ww = np.ones(4) if weight is None else w
        nll = -ww[t[kept]] * logp[kept, t[kept]]
        smooth = -(logp[kept] * ww).sum(1)
        want = ((1 - eps) * nll.sum() + eps / 4 * smooth.sum()) / ww[t[kept]].sum()
        got = F.cross_entropy(Tensor(x), t, weight, label_smoothing=eps)
        np.testing.assert_allclose(got.array, want, rtol=1e-12)
        gradcheck(lambda z: F.cross_entropy(z, t, weight, label_smoothing=eps), x)
        gradcheck(lambda z: F.cross_entropy(z, t, weight, reduction="none"), x)
    got = nn.CrossEntropyLoss(ignore_index=1)(Tensor(x), np.array([0, 1, 2, 1, 3, 3]))
    np.testing.assert_allclose(got.array, -logp[[0, 2, 4, 5], [0, 2, 3, 3]].mean(), rtol=1e-12)
    p = np.exp(RNG.standard_normal((6, 4)))
    p /= p.sum(1, keepdims=True)
    q = (1 - eps) * p + eps / 4
    np.testing.assert_allclose(F.cross_entropy(Tensor(x), p, label_smoothing=eps).array,
                               -(q * logp).sum(1).mean(), rtol=1e-12)
    gradcheck(lambda z: F.cross_entropy(z, p, w, reduction="sum"), x)
    with pytest.raises(TypeError, match="third argument is weight"):
        F.cross_entropy(Tensor(x), t, "sum")


# ---- optional parity with torch (skipped where torch is not installed) ----------------------

def test_attention_and_losses_match_torch():
    torch = pytest.importorskip("torch")
    tF = torch.nn.functional
    q, k, v = (RNG.standard_normal((2, 3, 5, 4)) for _ in range(3))
    ours = [Tensor(a, requires_grad=True) for a in (q, k, v)]
    theirs = [torch.tensor(a, requires_grad=True) for a in (q, k, v)]
    F.scaled_dot_product_attention(*ours, is_causal=True).sum().backward()
    tF.scaled_dot_product_attention(*theirs, is_causal=True).sum().backward()
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a.grad, b.grad.numpy(), rtol=1e-9, atol=1e-12)

    minidist.manual_seed(1)
    mha = nn.MultiheadAttention(8, 2, batch_first=True).double()
    tmha = torch.nn.MultiheadAttention(8, 2, batch_first=True).double()
    tmha.load_state_dict({n: torch.tensor(a) for n, a in mha.state_dict().items()})
    x = RNG.standard_normal((3, 5, 8))
    mask = np.triu(np.ones((5, 5), bool), 1)
    xo, xt = Tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    out, w = mha(xo, xo, xo, attn_mask=mask)
    tout, tw = tmha(xt, xt, xt, attn_mask=torch.tensor(mask))
    np.testing.assert_allclose(out.array, tout.detach().numpy(), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(w.array, tw.detach().numpy(), rtol=1e-9, atol=1e-12)
    (out.sum() + w.sum()).backward()
    (tout.sum() + tw.sum()).backward()
    np.testing.assert_allclose(xo.grad, xt.grad.numpy(), rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(mha.in_proj_weight.grad, tmha.in_proj_weight.grad.numpy(),
                               rtol=1e-8, atol=1e-12)

    x = RNG.standard_normal((6, 4))
    t = np.array([0, 3, -1, 1, 1, 2])
    w = np.array([1.0, 2.0, 0.5, 1.5])
    for kw in ({"ignore_index": -1}, {"ignore_index": -1, "label_smoothing": 0.1},
               {"ignore_index": -1, "weight": w, "label_smoothing": 0.3}):
        targs = {a: (torch.tensor(b) if isinstance(b, np.ndarray) else b) for a, b in kw.items()}
        np.testing.assert_allclose(F.cross_entropy(Tensor(x), t, **kw).array,
                                   tF.cross_entropy(torch.tensor(x), torch.tensor(t),
                                                    **targs).item(), rtol=1e-10)
    img = RNG.standard_normal((2, 3, 7, 6))
    np.testing.assert_allclose(F.adaptive_avg_pool2d(Tensor(img), (3, 4)).array,
                               tF.adaptive_avg_pool2d(torch.tensor(img), (3, 4)).numpy(),
                               rtol=1e-12)
    np.testing.assert_allclose(
        F.avg_pool2d(Tensor(img), 3, 2, 1, count_include_pad=False).array,
        tF.avg_pool2d(torch.tensor(img), 3, 2, 1, count_include_pad=False).numpy(), rtol=1e-12)
