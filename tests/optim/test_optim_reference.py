"""Every optimizer's update rule against an independent NumPy reference (tests/optim/
optim_reference.py): parameters and state after several steps, float64, with and without
``fused=True``. These run without torch, so the maths is checked on every run of the suite;
tests/optim/test_optim_torch.py compares the same optimizers with torch where it is installed."""

import numpy as np
import pytest

import optim_reference as ref
from minidist import nn, optim

pytestmark = pytest.mark.filterwarnings("ignore:.*kernels cannot run here:RuntimeWarning")

CONFIGS = [
    ("SGD", {"lr": 0.1}),
    ("SGD", {"lr": 0.1, "momentum": 0.9}),
    ("SGD", {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01}),
    ("SGD", {"lr": 0.1, "momentum": 0.8, "dampening": 0.3, "weight_decay": 0.1}),
    ("Adam", {}),
    ("Adam", {"lr": 1e-2, "weight_decay": 0.05}),
    ("Adam", {"amsgrad": True}),
    ("Adam", {"amsgrad": True, "weight_decay": 0.1, "lr": 0.01}),
    ("AdamW", {}),
    ("AdamW", {"lr": 3e-3, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.1}),
    ("AdamW", {"amsgrad": True, "lr": 0.01}),
    ("Adadelta", {}),
    ("Adadelta", {"lr": 0.5, "rho": 0.8, "weight_decay": 0.1, "maximize": True}),
    ("Adagrad", {}),
    ("Adagrad", {"lr": 0.1, "lr_decay": 0.05, "weight_decay": 0.01,
                 "initial_accumulator_value": 0.3}),
    ("Adagrad", {"maximize": True, "eps": 1e-3}),
    ("RMSprop", {}),
    ("RMSprop", {"lr": 0.01, "momentum": 0.9, "centered": True, "weight_decay": 0.01}),
    ("RMSprop", {"alpha": 0.9, "centered": True}),
    ("RMSprop", {"momentum": 0.5, "maximize": True}),
]
FUSABLE = ("SGD", "Adam", "AdamW")


def trajectories(steps=6, seed=0):
    """Parameters and per-step gradients whose sizes grow with the step, so a rule that mixes
    up its terms (a squared term doubled, a max taken as a min) moves the result visibly."""
    rng = np.random.default_rng(seed)
    params = [rng.normal(size=(3, 4)), rng.normal(size=(4,))]
    grads = [[rng.normal(size=p.shape) * (1 + s) * (1 if s % 2 else -0.3) for p in params]
             for s in range(steps)]
    return params, grads


def run_library(name, kwargs, init, grads):
    params = [nn.Parameter(p.copy()) for p in init]
    opt = getattr(optim, name)(params, **kwargs)
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = g.copy()
        opt.step()
    return [np.asarray(p.array) for p in params], opt.state_dict()["state"]


def run_reference(name, kwargs, init, grads):
    kwargs = {k: v for k, v in kwargs.items() if k not in ("fused", "foreach")}
    params, states = [p.copy() for p in init], [{} for _ in init]
    for step_grads in grads:
        params = [ref.RULES[name](p, g, s, **kwargs)
                  for p, g, s in zip(params, step_grads, states)]
    return params, states


def check(name, kwargs):
    init, grads = trajectories()
    ours, our_state = run_library(name, kwargs, init, grads)
    want, want_state = run_reference(name, kwargs, init, grads)
    for a, b in zip(ours, want):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    for i, state in enumerate(want_state):
        for key, value in state.items():
            if key == "step":
                assert int(np.asarray(our_state[i][key])) == value
            else:
                np.testing.assert_allclose(np.asarray(our_state[i][key]), value, rtol=1e-9,
                                           atol=1e-12, err_msg=f"state[{i}][{key!r}]")


@pytest.mark.parametrize("name,kwargs", CONFIGS, ids=[f"{n}-{k}" for n, k in CONFIGS])
def test_matches_the_numpy_reference(name, kwargs):
    check(name, kwargs)


FUSED = [(n, k) for n, k in CONFIGS if n in FUSABLE]


@pytest.mark.parametrize("name,kwargs", FUSED, ids=[f"{n}-{k}" for n, k in FUSED])
def test_fused_matches_the_numpy_reference(name, kwargs):
    """``fused=True`` (the compiled kernels; amsgrad takes the optimizer's own rule) computes
    the reference's numbers too: a check that does not compare a path with itself."""
    check(name, dict(kwargs, fused=True))


MUTATIONS = [
    # (module, the line as written, a plausible slip, the optimizer and options it breaks)
    ("rmsprop", "sq += (1 - alpha) * g * g", "sq += 2 * (1 - alpha) * g * g", "RMSprop", {}),
    ("adam", "v_hat = maximum(v_max, v)", "v_hat = -maximum(-v_max, -v)", "Adam",
     {"amsgrad": True}),
    ("adam", "v_hat = maximum(v_max, v)", "v_hat = -maximum(-v_max, -v)", "AdamW",
     {"amsgrad": True, "fused": True}),
]


def mutant(module, line, slip):
    """A copy of ``minidist.optim.<module>`` with ``line`` replaced by ``slip``."""
    import importlib.util
    import sys

    spec = importlib.util.find_spec(f"minidist.optim.{module}")
    source = open(spec.origin).read()
    assert source.count(line) == 1, f"optim/{module}.py no longer holds {line!r}: update MUTATIONS"
    name = f"minidist.optim._mutant_{module}"
    copy = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader=None))
    copy.__package__ = "minidist.optim"
    sys.modules[name] = copy
    try:
        exec(compile(source.replace(line, slip), spec.origin, "exec"), copy.__dict__)
    finally:
        del sys.modules[name]
    return copy


@pytest.mark.parametrize("module,line,slip,name,kwargs", MUTATIONS,
                         ids=[f"{m[3]}-{m[4]}" for m in MUTATIONS])
def test_a_slip_in_the_rule_fails_the_comparison(module, line, slip, name, kwargs, monkeypatch):
    """The comparison can fail: the same check run on a copy of the optimizer with one slip
    (RMSprop's squared term doubled, amsgrad's max taken as a min) raises."""
    monkeypatch.setattr(optim, name, getattr(mutant(module, line, slip), name))
    with pytest.raises(AssertionError):
        check(name, kwargs)
