"""nn: Module registration and naming, state_dict, layers vs hand-computed outputs, init, training."""

import math

import numpy as np
import pytest

import minidist
from minidist import nn
from minidist.tensor import Tensor


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 3)
        self.act = nn.ReLU()
        self.block = nn.Sequential(nn.Linear(3, 3), nn.Tanh(), nn.LayerNorm(3))
        self.head = nn.Linear(3, 2, bias=False)

    def forward(self, x):
        return self.head(self.block(self.act(self.fc1(x))))


NET_KEYS = ["fc1.weight", "fc1.bias", "block.0.weight", "block.0.bias", "block.2.weight",
            "block.2.bias", "head.weight"]


def test_registration_order_and_names_match_torch():
    net = Net()
    assert [n for n, _ in net.named_parameters()] == NET_KEYS
    assert list(net.state_dict()) == NET_KEYS
    assert [n for n, _ in net.named_children()] == ["fc1", "act", "block", "head"]
    assert len(list(net.modules())) == 8
    assert all(isinstance(p, nn.Parameter) and p.requires_grad for p in net.parameters())
    assert net.num_parameters() == 4 * 3 + 3 + 9 + 3 + 3 + 3 + 6
    seq = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 1))
    assert list(seq.state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert len(seq) == 3 and isinstance(seq[1], nn.ReLU) and isinstance(seq[-1], nn.Linear)
    assert len(seq[:2]) == 2


def test_shared_parameters_are_listed_once():
    net = nn.Module()
    lin = nn.Linear(2, 2)
    net.a, net.b = lin, lin
    assert len(list(net.parameters())) == 2


def test_parameter_slot_rejects_a_plain_value():
    lin = nn.Linear(2, 2)
    with pytest.raises(TypeError, match="cannot assign a ndarray to parameter 'weight'"):
        lin.weight = np.zeros((2, 2))


def test_train_eval_propagate():
    net = Net()
    assert net.training and net.block[2].training
    net.eval()
    assert not any(m.training for m in net.modules())
    net.train()
    assert all(m.training for m in net.modules())


def test_manual_seed_makes_init_reproducible_and_torch_bounds():
    minidist.manual_seed(7)
    a = Net().state_dict()
    minidist.manual_seed(7)
    b = Net().state_dict()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    minidist.manual_seed(8)
    assert not np.array_equal(Net().state_dict()["fc1.weight"], a["fc1.weight"])
    lin = nn.Linear(100, 50)
    bound = 1 / math.sqrt(100)
    for p in (lin.weight, lin.bias):
        assert p.dtype == np.float32 and np.abs(p.array).max() <= bound
        assert np.abs(p.array).max() > 0.9 * bound
    conv = nn.Conv2d(3, 8, 3)
    bound = 1 / math.sqrt(3 * 9)
    assert np.abs(conv.weight.array).max() <= bound and np.abs(conv.bias.array).max() <= bound


# ---- state_dict ---------------------------------------------------------------------------

def test_state_dict_round_trip_copies_in_place():
    minidist.manual_seed(0)
    src = Net()
    minidist.manual_seed(1)
    dst = Net()
    sd = src.state_dict()
    sd["fc1.weight"][0, 0] = 123.0  # a copy: editing it does not touch the source
    assert src.fc1.weight.array[0, 0] != 123.0
    arrays = [p.array for p in dst.parameters()]
    result = dst.load_state_dict(sd)
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert [p.array for p in dst.parameters()] == arrays or all(
        a is p.array for a, p in zip(arrays, dst.parameters()))
    assert dst.fc1.weight.array[0, 0] == 123.0
    for k, v in src.state_dict().items():
        if k != "fc1.weight":
            np.testing.assert_array_equal(dst.state_dict()[k], v)


def test_load_state_dict_errors_name_keys_and_shapes():
    net = Net()
    sd = net.state_dict()
    del sd["head.weight"]
    sd["extra.bias"] = np.zeros(3)
    sd["fc1.bias"] = np.zeros(5)
    with pytest.raises(nn.StateDictError) as info:
        net.load_state_dict(sd)
    msg = str(info.value)
    assert 'Missing key(s) in state_dict: "head.weight"' in msg
    assert 'Unexpected key(s) in state_dict: "extra.bias"' in msg
    assert "size mismatch for fc1.bias: copying a param with shape (5,) from checkpoint, the " \
           "shape in current model is (3,)" in msg
    assert isinstance(info.value, ValueError) and isinstance(info.value, RuntimeError)
    sd["fc1.bias"] = np.ones(3)
    result = net.load_state_dict(sd, strict=False)
    assert result.missing_keys == ["head.weight"] and result.unexpected_keys == ["extra.bias"]
    np.testing.assert_array_equal(net.fc1.bias.array, 1.0)


def test_zero_grad():
    lin = nn.Linear(3, 2)
    lin(Tensor(np.ones((1, 3), dtype=np.float32))).sum().backward()
    g = lin.weight.grad
    lin.zero_grad(set_to_none=False)
    assert lin.weight.grad is g and not g.any()
    lin.zero_grad()
    assert lin.weight.grad is None and lin.bias.grad is None


# ---- layers vs hand-computed outputs ------------------------------------------------------

def test_linear_with_set_weights():
    lin = nn.Linear(3, 2)
    lin.load_state_dict({"weight": np.array([[1, 2, 3], [0, -1, 1]]), "bias": np.array([0.5, -1])})
    out = lin(Tensor([[1.0, 1.0, 1.0], [2.0, 0.0, -1.0]]))
    np.testing.assert_allclose(out.array, [[6.5, -1.0], [-0.5, -2.0]])
    assert out.dtype == np.float32


def test_conv2d_matches_a_direct_loop():
    conv = nn.Conv2d(2, 3, kernel_size=3, stride=2, padding=1)
    x = np.random.default_rng(0).standard_normal((2, 2, 5, 5)).astype(np.float32)
    out = conv(Tensor(x)).array
    w, b = conv.weight.array, conv.bias.array
    xp_ = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = np.zeros((2, 3, 3, 3), dtype=np.float32)
    for n in range(2):
        for o in range(3):
            for i in range(3):
                for j in range(3):
                    want[n, o, i, j] = (xp_[n, :, 2 * i:2 * i + 3, 2 * j:2 * j + 3] * w[o]).sum() + b[o]
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


def test_maxpool_flatten():
    x = Tensor(np.arange(32, dtype=np.float32).reshape(1, 2, 4, 4))
    out = nn.MaxPool2d(2)(x)
    np.testing.assert_array_equal(out.array, [[[[5, 7], [13, 15]], [[21, 23], [29, 31]]]])
    assert nn.Flatten()(out).shape == (1, 8)


def test_layernorm_formula():
    ln = nn.LayerNorm(4)
    assert list(ln.state_dict()) == ["weight", "bias"]
    ln.load_state_dict({"weight": np.array([1, 2, 3, 4]), "bias": np.array([0, 0, 1, 1])})
    x = np.array([[1.0, 2.0, 3.0, 6.0]], dtype=np.float32)
    mu, var = x.mean(), x.var()
    want = (x - mu) / np.sqrt(var + 1e-5) * [1, 2, 3, 4] + [0, 0, 1, 1]
    np.testing.assert_allclose(ln(Tensor(x)).array, want, rtol=1e-5)


def test_activations_dropout_losses():
    x = Tensor(np.array([-1.0, 0.5, 2.0], dtype=np.float32))
    np.testing.assert_allclose(nn.ReLU()(x).array, [0, 0.5, 2])
    np.testing.assert_allclose(nn.Tanh()(x).array, np.tanh(x.array), rtol=1e-6)
    np.testing.assert_allclose(nn.GELU()(x).array, [-0.15865525, 0.34573123, 1.9544997], rtol=1e-6)
    drop = nn.Dropout(0.5)
    big = Tensor(np.ones((100, 100), dtype=np.float32))
    out = drop(big).array
    assert set(np.unique(out)) <= {0.0, 2.0} and 0.4 < (out == 0).mean() < 0.6
    assert drop.eval()(big) is big
    logits = Tensor(np.array([[2.0, 0.0], [0.0, 3.0]], dtype=np.float32))
    want = -np.log(np.exp(2) / (np.exp(2) + 1)) / 2 - np.log(np.exp(3) / (np.exp(3) + 1)) / 2
    np.testing.assert_allclose(nn.CrossEntropyLoss()(logits, [0, 1]).item(), want, rtol=1e-6)
    np.testing.assert_allclose(nn.MSELoss()(logits, np.zeros((2, 2))).item(), 13 / 4)


def test_model_gradient_matches_finite_differences():
    minidist.manual_seed(3)
    net = Net()
    for p in net.parameters():
        p.array = p.array.astype(np.float64)
    x = Tensor(np.random.default_rng(1).standard_normal((5, 4)))
    y = np.array([0, 1, 1, 0, 1])
    nn.CrossEntropyLoss()(net(x), y).backward()
    for name, p in net.named_parameters():
        flat = p.array.reshape(-1)
        for i in range(0, flat.size, 3):
            old = flat[i]
            flat[i] = old + 1e-6
            up = nn.CrossEntropyLoss()(net(x), y).item()
            flat[i] = old - 1e-6
            down = nn.CrossEntropyLoss()(net(x), y).item()
            flat[i] = old
            assert abs(p.grad.reshape(-1)[i] - (up - down) / 2e-6) < 1e-6, name


def test_small_cnn_learns_and_is_fast():
    rng = np.random.default_rng(0)
    minidist.manual_seed(0)
    x = rng.standard_normal((256, 1, 8, 8)).astype(np.float32)
    y = (x[:, 0, :4].sum((1, 2)) > x[:, 0, 4:].sum((1, 2))).astype(np.int64)  # top vs bottom
    model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(32 * 2 * 2, 2))
    loss_fn = nn.CrossEntropyLoss()
    losses = []
    for epoch in range(8):
        for i in range(0, 256, 32):
            loss = loss_fn(model(Tensor(x[i:i + 32])), y[i:i + 32])
            model.zero_grad()
            loss.backward()
            for p in model.parameters():
                p.array -= 0.1 * p.grad.array
            losses.append(loss.item())
    assert np.mean(losses[-8:]) < 0.6 * np.mean(losses[:8]), losses
    assert all(p.dtype == np.float32 for p in model.parameters())
