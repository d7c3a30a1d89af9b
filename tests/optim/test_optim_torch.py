"""Adadelta, Adagrad, RMSprop and Adam(amsgrad=True) against torch.optim (values after several
steps, float64, 1e-6), and the public way to write an optimizer (torch's: override ``step``,
keep state in ``self.state[p]``)."""

import numpy as np
import pytest

from minidist import nn, optim

CONFIGS = [
    ("Adadelta", {}),
    ("Adadelta", {"lr": 0.5, "rho": 0.8, "weight_decay": 0.1, "maximize": True}),
    ("Adagrad", {}),
    ("Adagrad", {"lr": 0.1, "lr_decay": 0.05, "weight_decay": 0.01,
                 "initial_accumulator_value": 0.3}),
    ("RMSprop", {}),
    ("RMSprop", {"lr": 0.01, "momentum": 0.9, "centered": True, "weight_decay": 0.01}),
    ("RMSprop", {"alpha": 0.9, "centered": True}),
    ("Adam", {"amsgrad": True}),
    ("Adam", {"amsgrad": True, "weight_decay": 0.1, "lr": 0.01}),
    ("AdamW", {"amsgrad": True, "lr": 0.01}),
]


def trajectories(steps=6, seed=0):
    rng = np.random.default_rng(seed)
    params = [rng.normal(size=(3, 4)), rng.normal(size=(4,))]
    grads = [[rng.normal(size=p.shape) * (1 + s) for p in params] for s in range(steps)]
    return params, grads


@pytest.mark.parametrize("name,kwargs", CONFIGS, ids=[f"{n}-{k}" for n, k in CONFIGS])
def test_matches_torch_after_several_steps(name, kwargs):
    torch = pytest.importorskip("torch")
    init, grads = trajectories()
    ours = [nn.Parameter(p.copy()) for p in init]
    theirs = [torch.tensor(p.copy(), requires_grad=True) for p in init]
    opt = getattr(optim, name)(ours, **kwargs)
    topt = getattr(torch.optim, name)(theirs, **kwargs)
    for step_grads in grads:
        for p, t, g in zip(ours, theirs, step_grads):
            p.grad, t.grad = g.copy(), torch.tensor(g.copy())
        opt.step()
        topt.step()
    for p, t in zip(ours, theirs):
        np.testing.assert_allclose(p.array, t.detach().numpy(), rtol=1e-6, atol=1e-9)
    ours_state, theirs_state = opt.state_dict()["state"], topt.state_dict()["state"]
    assert sorted(ours_state) == sorted(theirs_state)
    for i in ours_state:
        assert set(ours_state[i]) == set(theirs_state[i])
        for key, value in theirs_state[i].items():
            if key != "step":
                np.testing.assert_allclose(ours_state[i][key], value.numpy(), rtol=1e-6,
                                           atol=1e-9)


@pytest.mark.parametrize("name,kwargs", CONFIGS[::3], ids=[n for n, _ in CONFIGS[::3]])
def test_state_dict_round_trip_continues_identically(name, kwargs):
    init, grads = trajectories(steps=4, seed=1)
    a = [nn.Parameter(p.copy()) for p in init]
    opt_a = getattr(optim, name)(a, **kwargs)
    for step_grads in grads[:2]:
        for p, g in zip(a, step_grads):
            p.grad = g.copy()
        opt_a.step()
    b = [nn.Parameter(p.array.copy()) for p in a]
    opt_b = getattr(optim, name)(b, **kwargs)
    opt_b.load_state_dict(opt_a.state_dict())
    for step_grads in grads[2:]:
        for pa, pb, g in zip(a, b, step_grads):
            pa.grad, pb.grad = g.copy(), g.copy()
        opt_a.step()
        opt_b.step()
    for pa, pb in zip(a, b):
        np.testing.assert_array_equal(pa.array, pb.array)


class SignSGD(optim.Optimizer):
    """Written as a torch user writes one: public names only."""

    def __init__(self, params, lr=0.01, momentum=0.9):
        super().__init__(params, dict(lr=lr, momentum=momentum))

    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = 0
                    state["momentum_buffer"] = np.zeros_like(p.array)
                state["step"] += 1
                buf = state["momentum_buffer"]
                buf *= group["momentum"]
                buf += p.grad.array
                p.array -= group["lr"] * np.sign(buf)
        return loss


def test_a_torch_style_optimizer_needs_only_public_names():
    model = nn.Linear(3, 2)
    opt = SignSGD(model.parameters(), lr=0.5)
    before = model.weight.array.copy()

    def closure():
        opt.zero_grad()
        loss = model(np.ones((4, 3), np.float32)).sum()
        loss.backward()
        return loss

    loss = opt.step(closure)
    assert float(loss) != 0.0
    np.testing.assert_allclose(model.weight.array, before - 0.5)      # sign of +grad
    state = opt.state_dict()
    assert state["state"][0]["step"] == 1 and opt.state[model.weight] is opt.state[0]
    other = SignSGD(nn.Linear(3, 2).parameters(), lr=0.5)
    other.load_state_dict(state)
    np.testing.assert_array_equal(other.state[0]["momentum_buffer"],
                                  state["state"][0]["momentum_buffer"])
    with pytest.raises(KeyError, match="not in any of its param_groups"):
        opt.state[nn.Parameter(np.zeros(2))]


def test_unsupported_flags_are_refused():
    p = [nn.Parameter(np.zeros(2))]
    with pytest.raises(ValueError, match="differentiable=True"):
        optim.Adagrad(p, differentiable=True)
    with pytest.raises(ValueError, match="invalid lr"):
        optim.RMSprop(p, lr=-1.0)
