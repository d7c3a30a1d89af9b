"""Autocast's cast cache, as torch's: a float32 parameter is cast to float16 once per
autocast region, however often it is used there, and the cache is cleared when the outermost
region exits (so the next step casts the updated weights)."""

import numpy as np

import minidist
from minidist import amp, nn, optim
from minidist.tensor import Tensor, autocast_mode
from minidist.tensor import losses as F


def mlp(seed=0):
    minidist.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 10))


def batch(seed=0, n=8):
    rng = np.random.default_rng(seed)
    return Tensor(rng.normal(size=(n, 16)).astype(np.float32)), rng.integers(0, 10, size=n)


def weight_casts():
    return autocast_mode.cast_counts().get("weights", 0)


def test_an_amp_step_casts_each_weight_at_most_once():
    model = mlp()
    params = list(model.parameters())
    opt = optim.SGD(params, lr=0.1, momentum=0.9)
    scaler = amp.GradScaler()
    for step in range(3):
        x, y = batch(step)
        before = weight_casts()
        with amp.autocast("cpu"):
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        assert weight_casts() - before == len(params)  # 2 weights + 2 biases, once each


def test_a_weight_used_twice_in_a_region_is_cast_once_with_the_summed_gradient():
    model = mlp()
    x1, _ = batch(1)
    x2, _ = batch(2)
    before = weight_casts()
    with amp.autocast("cpu"):
        with amp.autocast("cpu"):           # a nested region shares the outer one's cache
            out1 = model(x1)
        out2 = model(x2)                    # the same float16 weights, from the cache
    assert weight_casts() - before == 4
    (out1.float().sum() + out2.float().sum()).backward()
    cached = [p.grad.array.copy() for p in model.parameters()]
    for p in model.parameters():
        p.grad = None
    with amp.autocast("cpu"):               # the same sum, casting each use separately
        out1 = model(x1)
        autocast_mode.clear_autocast_cache()
        out2 = model(x2)
    assert weight_casts() - before == 12
    (out1.float().sum() + out2.float().sum()).backward()
    for a, p in zip(cached, model.parameters()):
        assert a.dtype == np.float32
        np.testing.assert_allclose(a, p.grad, rtol=1e-2, atol=1e-2)


def test_the_cache_is_cleared_when_the_outermost_region_exits():
    model = mlp()
    x, _ = batch()
    before = weight_casts()
    with amp.autocast("cpu"):
        model(x)
    with amp.autocast("cpu"):               # a new region: the (maybe updated) weights again
        model(x)
    assert weight_casts() - before == 8
    with amp.autocast("cpu"):
        with minidist.no_grad():            # a no_grad cast is not the tape's cast
            model(x)
        out = model(x)
    assert out.requires_grad and weight_casts() - before == 16
