"""Recurrent and transformer layers, GroupNorm, pooling options, torch's initializers and
``inplace=``: shapes, keys and gradients here, and outputs and gradients against torch (loaded
from torch's state_dict) where torch is installed."""

import math

import numpy as np
import pytest

import minidist
from minidist import nn
from minidist.nn import functional as F
from minidist.tensor import Tensor

RNG = np.random.default_rng(0)
TOL = dict(rtol=1e-5, atol=1e-5)  # float32


def numeric_grad(f, x, eps=1e-6):
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        old = x[i]
        x[i] = old + eps
        hi = f()
        x[i] = old - eps
        lo = f()
        x[i] = old
        g[i] = (hi - lo) / (2 * eps)
    return g


@pytest.mark.parametrize("kind", ["RNN", "LSTM", "GRU"])
def test_recurrent_keys_shapes_and_gradients_by_finite_differences(kind):
    minidist.manual_seed(0)
    m = getattr(nn, kind)(3, 4, num_layers=2, bidirectional=True, batch_first=True,
                          dtype=np.float64)
    gates = {"RNN": 1, "LSTM": 4, "GRU": 3}[kind]
    sd = m.state_dict()
    assert list(sd)[:4] == ["weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"]
    assert "weight_ih_l1_reverse" in sd and sd["weight_ih_l1"].shape == (gates * 4, 8)
    x = RNG.normal(size=(2, 5, 3))
    out, state = m(Tensor(x))
    h_n = state[0] if kind == "LSTM" else state
    assert out.shape == (2, 5, 8) and h_n.shape == (4, 2, 4)
    # the last forward output is h_n of the top layer's forward direction
    np.testing.assert_allclose(out.array[:, -1, :4], h_n.array[2], rtol=1e-12)
    np.testing.assert_allclose(out.array[:, 0, 4:], h_n.array[3], rtol=1e-12)
    w = RNG.normal(size=out.shape)
    xt = Tensor(x, requires_grad=True)
    (m(xt)[0] * Tensor(w)).sum().backward()
    loss = lambda: float((m(Tensor(x))[0].array * w).sum())  # noqa: E731
    np.testing.assert_allclose(xt.grad, numeric_grad(loss, x), rtol=1e-5, atol=1e-7)
    p = m.weight_hh_l0_reverse
    np.testing.assert_allclose(p.grad, numeric_grad(loss, p.array), rtol=1e-5, atol=1e-7)


def test_recurrent_unbatched_initial_state_and_errors():
    lstm = nn.LSTM(3, 4)
    h0, c0 = minidist.randn(1, 4), minidist.randn(1, 4)
    out, (h, c) = lstm(minidist.randn(6, 3), (h0, c0))
    assert out.shape == (6, 4) and h.shape == c.shape == (1, 4)
    with pytest.raises(ValueError, match="initial state"):
        lstm(minidist.randn(6, 2, 3), minidist.randn(1, 2, 4))
    with pytest.raises(ValueError, match="input of shape"):
        nn.GRU(3, 4)(minidist.randn(6, 2, 5))
    with pytest.raises(ValueError, match="proj_size"):
        nn.LSTM(3, 4, proj_size=2)
    assert repr(nn.LSTM(3, 4, 2, dropout=0.5)) == "LSTM(3, 4, num_layers=2, dropout=0.5)"


def test_transformer_keys_causal_mask_and_deep_copies():
    layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0)
    enc = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(8))
    keys = list(enc.state_dict())
    assert keys[:4] == ["layers.0.self_attn.in_proj_weight", "layers.0.self_attn.in_proj_bias",
                        "layers.0.self_attn.out_proj.weight", "layers.0.self_attn.out_proj.bias"]
    assert "layers.1.norm2.bias" in keys and keys[-1] == "norm.bias"
    assert enc.layers[0].linear1.weight is not enc.layers[1].linear1.weight
    mask = nn.Transformer.generate_square_subsequent_mask(4)
    assert np.isneginf(mask.array[0, 1]) and mask.array[1, 0] == 0
    x = RNG.normal(size=(4, 1, 8)).astype(np.float32)
    y = enc(Tensor(x), mask=mask).array
    x2 = x.copy()
    x2[3] += 1.0                                   # a later token cannot change earlier outputs
    np.testing.assert_allclose(enc(Tensor(x2), mask=mask).array[:3], y[:3], rtol=1e-5, atol=1e-6)
    model = nn.Transformer(8, 2, 1, 1, 16, dropout=0.0, batch_first=True)
    assert model(minidist.randn(2, 5, 8), minidist.randn(2, 3, 8)).shape == (2, 3, 8)
    with pytest.raises(ValueError, match="activation"):
        nn.TransformerEncoderLayer(8, 2, activation="swish")


def test_group_norm_normalizes_each_group():
    gn = nn.GroupNorm(2, 4, eps=0.0)
    x = RNG.normal(size=(3, 4, 2, 2))
    y = gn(Tensor(x)).array.reshape(3, 2, -1)
    np.testing.assert_allclose(y.mean(-1), 0, atol=1e-12)
    np.testing.assert_allclose(y.std(-1), 1, rtol=1e-10)
    with pytest.raises(ValueError, match="divisible"):
        nn.GroupNorm(3, 4)


def test_max_pool_padding_dilation_ceil_mode_sizes():
    x = Tensor(RNG.normal(size=(1, 1, 7, 7)))
    assert nn.MaxPool2d(3, 2, padding=1)(x).shape == (1, 1, 4, 4)   # ResNet's stem pool
    assert nn.MaxPool2d(2, ceil_mode=True)(x).shape == (1, 1, 4, 4)
    assert nn.MaxPool2d(2)(x).shape == (1, 1, 3, 3)
    assert nn.MaxPool2d(2, 1, dilation=2)(x).shape == (1, 1, 5, 5)
    neg = Tensor(-np.ones((1, 1, 2, 2)))
    np.testing.assert_array_equal(F.max_pool2d(neg, 3, 1, padding=1).array, -1)  # -inf padding
    with pytest.raises(ValueError, match="half"):
        nn.MaxPool2d(2, padding=2)(x)
    ones = Tensor(np.ones((1, 1, 5, 5)))
    # ceil_mode: the last window covers one row and column and divides by what it covers
    np.testing.assert_array_equal(nn.AvgPool2d(2, ceil_mode=True)(ones).array, 1.0)
    assert nn.AvgPool2d(2, ceil_mode=True)(ones).shape == (1, 1, 3, 3)


def test_inplace_is_accepted_and_computes_the_same():
    x = minidist.randn(3, 4)
    np.testing.assert_array_equal(nn.ReLU(inplace=True)(x).array, F.relu(x).array)
    np.testing.assert_array_equal(F.relu(x, inplace=True).array, np.maximum(x.array, 0))
    assert repr(nn.ReLU(inplace=True)) == "ReLU(inplace=True)"
    d = nn.Dropout(0.5, inplace=True).eval()
    assert d(x) is x and F.dropout(x, 0.5, False, True) is x
    assert repr(nn.Dropout2d(0.1, inplace=True)) == "Dropout2d(p=0.1, inplace=True)"


def test_initializers_follow_torchs_formulas():
    init = nn.init
    assert init.calculate_gain("relu") == math.sqrt(2) and init.calculate_gain("tanh") == 5 / 3
    minidist.manual_seed(0)
    w = nn.Parameter(np.zeros((256, 64, 3, 3), np.float32))
    init.kaiming_normal_(w, mode="fan_out", nonlinearity="relu")
    assert abs(w.array.std() / math.sqrt(2 / (256 * 9)) - 1) < 0.02
    init.kaiming_uniform_(w, a=math.sqrt(5))                      # Linear/Conv2d default
    assert abs(w.array).max() <= 1 / math.sqrt(64 * 9)
    init.xavier_normal_(w)
    assert abs(w.array.std() / math.sqrt(2 / (64 * 9 + 256 * 9)) - 1) < 0.02
    init.trunc_normal_(w, std=0.02, a=-0.03, b=0.03)
    assert w.array.min() >= -0.03 and w.array.max() <= 0.03
    init.orthogonal_(w)
    flat = w.array.reshape(256, -1)
    np.testing.assert_allclose(flat @ flat.T, np.eye(256), atol=1e-4)
    m = nn.Parameter(np.zeros((3, 5), np.float32))
    np.testing.assert_array_equal(init.eye_(m).array, np.eye(3, 5))
    init.sparse_(m, 0.5)
    assert ((m.array == 0).sum(0) >= 2).all()
    c = nn.Parameter(np.zeros((2, 2, 3, 3), np.float32))
    y = F.conv2d(Tensor(RNG.normal(size=(1, 2, 4, 4)).astype(np.float32)), init.dirac_(c),
                 padding=1)
    assert y.shape == (1, 2, 4, 4)


# ---- against torch (skipped where torch is not installed) ----------------------------------

def _load(ours, theirs):
    sd = {k: v.detach().numpy() for k, v in theirs.state_dict().items()}
    assert list(sd) == list(ours.state_dict())
    ours.load_state_dict(sd)


def _compare(torch, theirs, ours, inputs, **kwargs):
    """Same weights, same inputs: outputs, input gradients and parameter gradients agree."""
    _load(ours, theirs)
    tx = [torch.tensor(x, requires_grad=True) for x in inputs]
    mx = [Tensor(x.copy(), requires_grad=True) for x in inputs]
    t_out, m_out = theirs(*tx, **{k: torch.tensor(v) for k, v in kwargs.items()}), \
        ours(*mx, **kwargs)
    t_flat = list(torch.utils._pytree.tree_leaves(t_out))
    m_flat = [m_out[0]] + (list(m_out[1]) if isinstance(m_out[1], tuple) else [m_out[1]]) \
        if isinstance(m_out, tuple) else [m_out]
    t_loss = m_loss = 0
    for a, b in zip(t_flat, m_flat):
        np.testing.assert_allclose(b.array, a.detach().numpy(), **TOL)
        w = RNG.normal(size=a.shape).astype(np.float32)
        t_loss = t_loss + (a * torch.tensor(w)).sum()
        m_loss = m_loss + (b * Tensor(w)).sum()
    t_loss.backward()
    m_loss.backward()
    for a, b in zip(tx, mx):
        np.testing.assert_allclose(b.grad, a.grad.numpy(), **TOL)
    for (name, p), q in zip(theirs.named_parameters(), ours.parameters()):
        np.testing.assert_allclose(q.grad, p.grad.numpy(), **TOL, err_msg=name)


@pytest.mark.parametrize("kind", ["RNN", "LSTM", "GRU"])
@pytest.mark.parametrize("config", [
    {},
    {"num_layers": 2, "batch_first": True},
    {"num_layers": 2, "bidirectional": True},
    {"num_layers": 3, "bias": False, "bidirectional": True, "batch_first": True},
])
def test_recurrent_layers_match_torch(kind, config):
    torch = pytest.importorskip("torch")
    theirs = getattr(torch.nn, kind)(5, 6, **config)
    ours = getattr(nn, kind)(5, 6, **config)
    x = RNG.normal(size=(3, 7, 5)).astype(np.float32)
    _compare(torch, theirs, ours, [x])


@pytest.mark.parametrize("kind", ["RNN", "LSTM", "GRU"])
def test_recurrent_initial_state_and_relu_match_torch(kind):
    torch = pytest.importorskip("torch")
    extra = {"nonlinearity": "relu"} if kind == "RNN" else {}
    theirs, ours = getattr(torch.nn, kind)(4, 3, 2, **extra), getattr(nn, kind)(4, 3, 2, **extra)
    _load(ours, theirs)
    x = RNG.normal(size=(5, 2, 4)).astype(np.float32)
    h0 = RNG.normal(size=(2, 2, 3)).astype(np.float32)
    c0 = RNG.normal(size=(2, 2, 3)).astype(np.float32)
    t_state = (torch.tensor(h0), torch.tensor(c0)) if kind == "LSTM" else torch.tensor(h0)
    m_state = (Tensor(h0), Tensor(c0)) if kind == "LSTM" else Tensor(h0)
    t_out, _ = theirs(torch.tensor(x), t_state)
    m_out, _ = ours(Tensor(x), m_state)
    np.testing.assert_allclose(m_out.array, t_out.detach().numpy(), **TOL)


@pytest.mark.parametrize("config", [
    {"batch_first": True},
    {"norm_first": True, "activation": "gelu"},
    {"batch_first": True, "norm_first": True, "bias": False},
])
def test_transformer_layers_match_torch(config):
    torch = pytest.importorskip("torch")
    theirs = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, **config)
    ours = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, **config)
    x = RNG.normal(size=(2, 5, 16)).astype(np.float32)
    length = 5 if config.get("batch_first") else 2
    mask = np.triu(np.ones((length, length), bool), 1)
    _compare(torch, theirs, ours, [x], src_mask=mask)
    theirs = torch.nn.TransformerDecoderLayer(16, 4, 32, dropout=0.0, **config)
    ours = nn.TransformerDecoderLayer(16, 4, 32, dropout=0.0, **config)
    _compare(torch, theirs, ours, [x, RNG.normal(size=(2, 5, 16)).astype(np.float32)],
             tgt_mask=mask)


def test_encoder_and_full_transformer_match_torch():
    torch = pytest.importorskip("torch")
    theirs = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(16, 4, 32, 0.0), 2,
                                         norm=torch.nn.LayerNorm(16), enable_nested_tensor=False)
    ours = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 4, 32, 0.0), 2,
                                 norm=nn.LayerNorm(16))
    x = RNG.normal(size=(5, 2, 16)).astype(np.float32)
    pad = np.array([[False] * 4 + [True], [False] * 5])
    _compare(torch, theirs, ours, [x], src_key_padding_mask=pad)
    theirs = torch.nn.Transformer(16, 4, 2, 2, 32, dropout=0.0, batch_first=True)
    ours = nn.Transformer(16, 4, 2, 2, 32, dropout=0.0, batch_first=True)
    tgt_mask = nn.Transformer.generate_square_subsequent_mask(3).array
    np.testing.assert_array_equal(
        tgt_mask, torch.nn.Transformer.generate_square_subsequent_mask(3).numpy())
    _compare(torch, theirs, ours, [x.transpose(1, 0, 2).copy(),
                                   RNG.normal(size=(2, 3, 16)).astype(np.float32)],
             tgt_mask=tgt_mask)


def test_group_norm_and_pooling_match_torch():
    torch = pytest.importorskip("torch")
    theirs, ours = torch.nn.GroupNorm(3, 6), nn.GroupNorm(3, 6)
    with torch.no_grad():
        theirs.weight.normal_()
        theirs.bias.normal_()
    _compare(torch, theirs, ours, [RNG.normal(size=(2, 6, 4, 5)).astype(np.float32)])
    for args in [dict(kernel_size=3, stride=2, padding=1),
                 dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
                 dict(kernel_size=(3, 2), stride=(2, 1), padding=(1, 1), dilation=(2, 1))]:
        _compare(torch, torch.nn.MaxPool2d(**args), nn.MaxPool2d(**args),
                 [RNG.normal(size=(2, 3, 9, 10)).astype(np.float32)])
    for args in [dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
                 dict(kernel_size=3, stride=2, padding=1, ceil_mode=True,
                      count_include_pad=False),
                 dict(kernel_size=(3, 2), stride=(2, 1), padding=(1, 1)),
                 dict(kernel_size=2, ceil_mode=True, divisor_override=3)]:
        _compare(torch, torch.nn.AvgPool2d(**args), nn.AvgPool2d(**args),
                 [RNG.normal(size=(2, 3, 9, 10)).astype(np.float32)])


def test_gains_and_fans_match_torch():
    torch = pytest.importorskip("torch")
    for name, param in [("relu", None), ("tanh", None), ("leaky_relu", None),
                        ("leaky_relu", 0.2), ("selu", None), ("conv2d", None)]:
        assert nn.init.calculate_gain(name, param) == torch.nn.init.calculate_gain(name, param)
    w = torch.empty(8, 4, 3, 3)
    assert nn.init.fans(Tensor(w.numpy())) == torch.nn.init._calculate_fan_in_and_fan_out(w)
