"""nn additions with torch's names: containers, Softmax/LogSoftmax, NLLLoss, apply, Embedding,
BatchNorm1d/2d; against reference formulas, and against torch when it is installed."""

import numpy as np
import pytest

import minidist
from minidist import nn
from minidist.nn import functional as F
from minidist.tensor import Tensor

RNG = np.random.default_rng(0)


def test_module_list_and_dict_register_children_in_order():
    layers = nn.ModuleList([nn.Linear(2, 3), nn.Linear(3, 1)])
    layers.append(nn.ReLU())
    heads = nn.ModuleDict({"a": nn.Linear(1, 2)})
    heads["b"] = nn.Linear(1, 4)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers, self.heads = layers, heads

    names = list(Net().state_dict())
    assert names == ["layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias",
                     "heads.a.weight", "heads.a.bias", "heads.b.weight", "heads.b.bias"]
    assert len(layers) == 3 and isinstance(layers[-1], nn.ReLU) and len(layers[:2]) == 2
    assert list(heads) == ["a", "b"] and "b" in heads and heads["b"].out_features == 4
    with pytest.raises(TypeError, match="Module"):
        layers.append(3)


def test_softmax_logsoftmax_nll_equal_cross_entropy():
    x = RNG.normal(size=(5, 4))
    t = np.array([0, 3, 1, 1, 2])
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(nn.Softmax(dim=1)(Tensor(x)).array, e / e.sum(1, keepdims=True))
    logp = nn.LogSoftmax(dim=1)(Tensor(x, requires_grad=True))
    for red in ("mean", "sum", "none"):
        want = -np.log(e / e.sum(1, keepdims=True))[np.arange(5), t]
        want = want.mean() if red == "mean" else want.sum() if red == "sum" else want
        np.testing.assert_allclose(F.nll_loss(logp, t, red).array, want, rtol=1e-12)
        np.testing.assert_allclose(nn.NLLLoss(red)(logp, t).array,
                                   F.cross_entropy(Tensor(x), t, reduction=red).array, rtol=1e-12)
    a, b = Tensor(x, requires_grad=True), Tensor(x, requires_grad=True)
    F.nll_loss(F.log_softmax(a), t).backward()
    F.cross_entropy(b, t).backward()
    np.testing.assert_allclose(a.grad, b.grad, rtol=1e-10, atol=1e-14)
    with pytest.raises(ValueError, match="outside"):
        F.nll_loss(logp, np.array([0, 4, 0, 0, 0]))


def test_apply_visits_children_first_then_self():
    model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 2)))
    seen = []
    assert model.apply(lambda m: seen.append(type(m).__name__)) is model
    assert seen == ["Linear", "Linear", "Sequential", "Sequential"]

    def init_weights(m):
        if isinstance(m, nn.Linear):
            nn.init.constant_(m.weight, 0.5)

    model.apply(init_weights)
    assert all((p.array == 0.5).all() for n, p in model.named_parameters() if "weight" in n)


def test_embedding_gathers_rows_and_sums_repeated_gradients():
    minidist.manual_seed(0)
    emb = nn.Embedding(5, 3)
    idx = np.array([[1, 4], [1, 0]])
    out = emb(idx)
    np.testing.assert_array_equal(out.array, emb.weight.array[idx])
    out.sum().backward()
    np.testing.assert_array_equal(emb.weight.grad[:, 0], [1, 2, 0, 0, 1])
    with pytest.raises(IndexError, match="outside"):
        emb(np.array([5]))


@pytest.mark.parametrize("cls, shape", [(nn.BatchNorm1d, (8, 3)), (nn.BatchNorm1d, (8, 3, 5)),
                                        (nn.BatchNorm2d, (4, 3, 5, 6))])
def test_batchnorm_train_and_eval_against_the_formulas(cls, shape):
    x = RNG.normal(2.0, 3.0, size=shape)
    bn = cls(3, momentum=0.2).double()
    assert list(bn.state_dict()) == ["weight", "bias", "running_mean", "running_var",
                                     "num_batches_tracked"]
    assert bn.num_batches_tracked.dtype == np.int64
    axes = (0,) + tuple(range(2, len(shape)))
    b = (1, 3) + (1,) * (len(shape) - 2)
    n = x.size // 3
    mean, var = x.mean(axes), x.var(axes)
    t = Tensor(x, requires_grad=True)
    y = bn(t)
    np.testing.assert_allclose(y.array, (x - mean.reshape(b)) / np.sqrt(var.reshape(b) + 1e-5),
                               rtol=1e-10)
    np.testing.assert_allclose(bn.running_mean.array, 0.2 * mean, rtol=1e-12)
    np.testing.assert_allclose(bn.running_var.array, 0.8 + 0.2 * var * n / (n - 1), rtol=1e-12)
    assert int(bn.num_batches_tracked.array) == 1
    (y * y).sum().backward()
    assert t.grad.shape == shape and bn.weight.grad is not None
    bn.eval()
    before = bn.running_mean.array.copy()
    ye = bn(Tensor(x))
    want = (x - bn.running_mean.array.reshape(b)) / np.sqrt(bn.running_var.array.reshape(b) + 1e-5)
    np.testing.assert_allclose(ye.array, want, rtol=1e-10)
    np.testing.assert_array_equal(bn.running_mean.array, before)        # eval leaves them alone


def test_batchnorm_rejects_wrong_shapes():
    with pytest.raises(ValueError, match="channels"):
        nn.BatchNorm2d(3)(Tensor(np.zeros((2, 4, 2, 2), np.float32)))
    with pytest.raises(ValueError, match="more than 1 value"):
        nn.BatchNorm1d(3)(Tensor(np.zeros((1, 3), np.float32)))


def test_against_torch():
    torch = pytest.importorskip("torch")
    x = RNG.normal(size=(6, 3, 4, 4))
    tb, mb = torch.nn.BatchNorm2d(3).double(), nn.BatchNorm2d(3).double()
    for step in range(3):
        ty = tb(torch.from_numpy(x + step))
        my = mb(Tensor(x + step))
        np.testing.assert_allclose(ty.detach().numpy(), my.array, rtol=1e-9, atol=1e-12)
    for k, v in tb.state_dict().items():
        np.testing.assert_allclose(v.numpy(), mb.state_dict()[k], rtol=1e-12)
    tb.eval(), mb.eval()
    np.testing.assert_allclose(tb(torch.from_numpy(x)).detach().numpy(), mb(Tensor(x)).array,
                               rtol=1e-9, atol=1e-12)
    t = torch.from_numpy(RNG.normal(size=(4, 5)))
    target = torch.tensor([0, 4, 2, 2])
    np.testing.assert_allclose(torch.nn.functional.nll_loss(t.log_softmax(1), target).item(),
                               F.nll_loss(F.log_softmax(Tensor(t.numpy())), target.numpy()).item(),
                               rtol=1e-12)
    ml = nn.ModuleList([nn.Linear(2, 2)])
    tl = torch.nn.ModuleList([torch.nn.Linear(2, 2)])
    assert list(ml.state_dict()) == list(tl.state_dict())
