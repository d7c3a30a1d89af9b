"""Optimizers, schedules and clipping against arithmetic written out by hand (torch's formulas).

Parameters are real ``nn.Parameter``s when minidist.nn exists, else a tiny stand-in with the
same two attributes the optimizers use: ``.array`` (array) and ``.grad`` (array or None).
"""

import math

import numpy as np
import pytest

from minidist import optim


def make_param(values):
    from minidist.nn import Parameter

    p = Parameter(np.array(values, dtype=np.float64))
    if p.array.dtype != np.float64:  # a Parameter that casts keeps our arithmetic exact enough
        p.array = p.array.astype(np.float64)
    return p


def run(opt, params, grads):
    """Apply one optimizer step per entry of grads (a list of per-param grad lists)."""
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = None if g is None else np.array(g, dtype=np.float64)
        opt.step()


# ----------------------------------------------------------------------------- SGD
def test_sgd_plain_on_quadratic():
    # loss = p^2, g = 2p, lr 0.1:  p: 1 -> 1 - 0.1*2 = 0.8 -> 0.8 - 0.16 = 0.64
    p = make_param([1.0])
    opt = optim.SGD([p], lr=0.1)
    data = p.array
    for expected in (0.8, 0.64):
        p.grad = 2 * p.array
        opt.step()
        assert p.array[0] == pytest.approx(expected, abs=1e-12)
    assert p.array is data  # updated in place, never rebound


def test_sgd_momentum_first_step_has_no_dampening():
    # g = [0.5, 1] every step, lr 0.1, momentum 0.9
    # step 1: buf = g = [0.5, 1]                          p = [1 - .05, -2 - .1]   = [0.95, -2.1]
    # step 2: buf = .9*[.5, 1] + [.5, 1] = [.95, 1.9]     p = [.95-.095, -2.1-.19] = [0.855, -2.29]
    # step 3: buf = .9*[.95,1.9] + [.5,1] = [1.355, 2.71] p = [.855-.1355, -2.29-.271] = [.7195, -2.561]
    p = make_param([1.0, -2.0])
    opt = optim.SGD([p], lr=0.1, momentum=0.9)
    for expected in ([0.95, -2.1], [0.855, -2.29], [0.7195, -2.561]):
        run(opt, [p], [[[0.5, 1.0]]])
        np.testing.assert_allclose(p.array, expected, atol=1e-12)
    np.testing.assert_allclose(opt.state[0]["momentum_buffer"], [1.355, 2.71], atol=1e-12)


def test_sgd_nesterov():
    # step 1: buf = g = [.5, 1]; d = g + .9*buf = [.95, 1.9];  p = [1 - .095, -2 - .19] = [.905, -2.19]
    # step 2: buf = .9*buf + g = [.95, 1.9]; d = g + .9*buf = [1.355, 2.71]; p = [.7695, -2.461]
    p = make_param([1.0, -2.0])
    opt = optim.SGD([p], lr=0.1, momentum=0.9, nesterov=True)
    for expected in ([0.905, -2.19], [0.7695, -2.461]):
        run(opt, [p], [[[0.5, 1.0]]])
        np.testing.assert_allclose(p.array, expected, atol=1e-12)


def test_sgd_weight_decay_and_dampening():
    # p = 1, g = 0.5, lr .1, momentum .9, dampening .5, weight_decay .1
    # step 1: d = .5 + .1*1 = .6;        buf = .6 (first step: no dampening)       p = 1 - .06 = .94
    # step 2: d = .5 + .094 = .594;      buf = .9*.6 + .5*.594 = .837              p = .94 - .0837 = .8563
    # step 3: d = .5 + .08563 = .58563;  buf = .9*.837 + .5*.58563 = 1.046115      p = .7516885
    p = make_param([1.0])
    opt = optim.SGD([p], lr=0.1, momentum=0.9, dampening=0.5, weight_decay=0.1)
    for expected in (0.94, 0.8563, 0.7516885):
        run(opt, [p], [[[0.5]]])
        assert p.array[0] == pytest.approx(expected, abs=1e-12)
    # the gradient itself is left untouched (torch adds the decay into a copy)
    assert p.grad[0] == 0.5


def test_sgd_skips_params_without_grad_and_groups_have_own_lr():
    a, b, c = make_param([1.0]), make_param([1.0]), make_param([1.0])
    opt = optim.SGD([{"params": [a, b]}, {"params": [c], "lr": 0.5}], lr=0.1)
    run(opt, [a, b, c], [[[1.0], None, [1.0]]])
    assert (a.array[0], b.array[0], c.array[0]) == pytest.approx((0.9, 1.0, 0.5))
    assert opt.param_groups[1]["lr"] == 0.5 and opt.param_groups[0]["lr"] == 0.1


def test_sgd_argument_errors():
    p = make_param([1.0])
    with pytest.raises(ValueError, match="nesterov"):
        optim.SGD([p], lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="lr=-1"):
        optim.SGD([p], lr=-1)
    with pytest.raises(ValueError, match="required option 'lr'"):
        optim.SGD([p])
    with pytest.raises(ValueError, match="empty parameter list"):
        optim.SGD([], lr=0.1)
    with pytest.raises(ValueError, match="more than one group"):
        optim.SGD([{"params": [p]}, {"params": [p]}], lr=0.1)


# ----------------------------------------------------------------------------- Adam / AdamW
# Adam, lr .1, betas (.9, .999), eps 1e-8, p = 1, grads 0.5 then -1.0:
# step 1: m = .1*.5 = .05        v = .001*.25 = .00025
#         m^ = .05/(1-.9) = .5   sqrt(v)/sqrt(1-.999) = .5     p = 1 - .1*.5/(.5+1e-8) = 0.9 (+1e-9)
# step 2: m = .9*.05 - .1 = -.055      v = .999*.00025 + .001*1 = .00124975
#         step_size = .1/(1-.81) = .1/.19;   denom = sqrt(.00124975)/sqrt(1-.998001) + 1e-8
STEP1 = 1.0 - 0.1 * 0.5 / (0.5 + 1e-8)
DENOM2 = math.sqrt(0.00124975) / math.sqrt(0.001999) + 1e-8


def test_adam_two_hand_steps():
    p = make_param([1.0])
    opt = optim.Adam([p], lr=0.1)
    run(opt, [p], [[[0.5]]])
    assert p.array[0] == pytest.approx(STEP1, abs=1e-12)
    run(opt, [p], [[[-1.0]]])
    assert p.array[0] == pytest.approx(STEP1 - (0.1 / 0.19) * -0.055 / DENOM2, abs=1e-12)
    s = opt.state[0]
    assert s["step"] == 2
    assert s["exp_avg"][0] == pytest.approx(-0.055, abs=1e-15)
    assert s["exp_avg_sq"][0] == pytest.approx(0.00124975, abs=1e-15)


def test_adam_l2_weight_decay_is_added_to_the_grad():
    # wd .1: g = .5 + .1*1 = .6; m = .06, v = .00036; m^ = .6, sqrt(v^) = .6  -> p = 1 - .1*.6/(.6+1e-8)
    p = make_param([1.0])
    opt = optim.Adam([p], lr=0.1, weight_decay=0.1)
    run(opt, [p], [[[0.5]]])
    assert p.array[0] == pytest.approx(1.0 - 0.1 * 0.6 / (0.6 + 1e-8), abs=1e-12)
    assert opt.state[0]["exp_avg"][0] == pytest.approx(0.06, abs=1e-15)


def test_adamw_decoupled_decay_before_the_update():
    # wd .1, lr .1: step 1: p = 1*(1 - .01) = .99, then the Adam step of grad .5: .99 - .1*.5/(.5+1e-8)
    # step 2: p = p1 * .99, then the same Adam step as above for grads (.5, -1)
    p = make_param([1.0])
    opt = optim.AdamW([p], lr=0.1, weight_decay=0.1)
    run(opt, [p], [[[0.5]]])
    p1 = 0.99 - 0.1 * 0.5 / (0.5 + 1e-8)
    assert p.array[0] == pytest.approx(p1, abs=1e-12)
    run(opt, [p], [[[-1.0]]])
    assert p.array[0] == pytest.approx(p1 * 0.99 - (0.1 / 0.19) * -0.055 / DENOM2, abs=1e-12)
    assert optim.AdamW([make_param([0.0])]).param_groups[0]["weight_decay"] == 1e-2


def test_adam_argument_errors():
    with pytest.raises(ValueError, match=r"betas\[1\]=1.0"):
        optim.Adam([make_param([1.0])], betas=(0.9, 1.0))


# ----------------------------------------------------------------------------- zero_grad / state_dict
def test_zero_grad_none_or_in_place_zeros():
    p = make_param([1.0, 2.0])
    opt = optim.SGD([p], lr=0.1)
    p.grad = np.ones(2)
    g = p.grad
    opt.zero_grad(set_to_none=False)
    assert p.grad is g and not g.any()
    opt.zero_grad()
    assert p.grad is None


@pytest.mark.parametrize("make", [
    lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01),
    lambda ps: optim.SGD([{"params": ps[:1]}, {"params": ps[1:], "lr": 0.3}], lr=0.1,
                         momentum=0.5, nesterov=True),
    lambda ps: optim.Adam(ps, lr=0.01, weight_decay=0.1),
    lambda ps: optim.AdamW([{"params": ps[:1], "betas": (0.8, 0.99)}, {"params": ps[1:]}], lr=0.01),
])
def test_state_dict_round_trip_continues_identically(make):
    rng = np.random.default_rng(0)
    grads = [[rng.normal(size=(3, 2)), rng.normal(size=4)] for _ in range(6)]
    init = [rng.normal(size=(3, 2)), rng.normal(size=4)]
    pa = [make_param(v) for v in init]
    opt_a = make(pa)
    run(opt_a, pa, grads[:3])
    sd = opt_a.state_dict()
    # as a checkpoint gives it back: string keys, lists for tuples, step as a numpy scalar
    sd = {"state": {str(k): {n: (np.int64(v) if n == "step" else np.array(v)) for n, v in s.items()}
                    for k, s in sd["state"].items()},
          "param_groups": [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()}
                           for g in sd["param_groups"]]}
    pb = [make_param(p.array.copy()) for p in pa]
    opt_b = make(pb)
    opt_b.load_state_dict(sd)
    run(opt_a, pa, grads[3:])
    run(opt_b, pb, grads[3:])
    for a, b in zip(pa, pb):
        np.testing.assert_array_equal(a.array, b.array)
    loaded = [p for g in opt_b.param_groups for p in g["params"]]
    assert all(x is y for x, y in zip(loaded, pb))  # loading keeps this optimizer's parameters


def test_state_dict_layout_is_torchs():
    ps = [make_param([1.0]), make_param([2.0]), make_param([3.0])]
    opt = optim.SGD([{"params": ps[:2]}, {"params": ps[2:]}], lr=0.1, momentum=0.9)
    run(opt, ps, [[[1.0], None, [1.0]]])
    sd = opt.state_dict()
    assert sorted(sd["state"]) == [0, 2] and list(sd["state"][0]) == ["momentum_buffer"]
    assert [g["params"] for g in sd["param_groups"]] == [[0, 1], [2]]
    assert sd["param_groups"][0]["lr"] == 0.1 and sd["param_groups"][0]["momentum"] == 0.9


def test_load_state_dict_mismatches_are_clear():
    a = optim.SGD([make_param([1.0, 2.0])], lr=0.1, momentum=0.9)
    run(a, a.param_groups[0]["params"], [[[1.0, 1.0]]])
    sd = a.state_dict()
    with pytest.raises(ValueError, match="1 parameter groups but this optimizer has 2"):
        optim.SGD([{"params": [make_param([1.0])]}, {"params": [make_param([1.0])]}],
                  lr=0.1).load_state_dict(sd)
    with pytest.raises(ValueError, match="group 0 has 1 parameters in the checkpoint but 2 here"):
        optim.SGD([make_param([1.0]), make_param([1.0])], lr=0.1).load_state_dict(sd)
    with pytest.raises(ValueError, match=r"shape \(2,\) but the parameter has shape \(3,\)"):
        optim.SGD([make_param([1.0, 2.0, 3.0])], lr=0.1).load_state_dict(sd)
    with pytest.raises(ValueError, match="unknown state keys"):
        optim.Adam([make_param([1.0, 2.0])]).load_state_dict(sd)


# ----------------------------------------------------------------------------- schedules
def lrs_over(sched, steps):
    out = [sched.get_last_lr()[0]]
    for _ in range(steps):
        sched.step()
        out.append(sched.get_last_lr()[0])
    return out


def new_opt(lr=1.0):
    return optim.SGD([make_param([0.0])], lr=lr)


def test_step_lr():
    assert lrs_over(optim.StepLR(new_opt(), step_size=2, gamma=0.1), 5) == pytest.approx(
        [1.0, 1.0, 0.1, 0.1, 0.01, 0.01])


def test_cosine_annealing():
    # eta_min .1: .1 + .9*(1 + cos(pi t/4))/2 at t = 0..4: 1, .1+.9*.853553, .55, .1+.9*.146447, .1
    got = lrs_over(optim.CosineAnnealingLR(new_opt(), T_max=4, eta_min=0.1), 4)
    assert got == pytest.approx([1.0, 0.1 + 0.9 * 0.8535534, 0.55, 0.1 + 0.9 * 0.1464466, 0.1],
                                abs=1e-7)


def test_linear_warmup_and_lambda():
    assert lrs_over(optim.LinearWarmup(new_opt(2.0), warmup_steps=3), 4) == pytest.approx(
        [0.5, 1.0, 1.5, 2.0, 2.0])
    assert lrs_over(optim.LambdaLR(new_opt(), lambda s: 0.5 ** s), 3) == pytest.approx(
        [1.0, 0.5, 0.25, 0.125])


def test_warmup_cosine_sets_the_optimizer_lr():
    opt = new_opt()
    got = lrs_over(optim.WarmupCosine(opt, warmup_steps=4, total_steps=12, min_lr=0.1), 20)
    # warm-up (t+1)/5; t=8 is half-way: .1 + .9*.5; t >= 12: min_lr
    assert got[:5] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])
    assert got[8] == pytest.approx(0.55)
    assert got[12:] == pytest.approx([0.1] * 9)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1)
    with pytest.raises(ValueError, match="warmup_steps=5, total_steps=5"):
        optim.WarmupCosine(new_opt(), warmup_steps=5, total_steps=5)


def test_scheduler_state_dict_resumes():
    a = optim.CosineAnnealingLR(new_opt(), T_max=10)
    lrs_over(a, 4)
    opt_b = new_opt()
    b = optim.CosineAnnealingLR(opt_b, T_max=10)
    b.load_state_dict(a.state_dict())
    assert opt_b.param_groups[0]["lr"] == a.optimizer.param_groups[0]["lr"]
    assert lrs_over(a, 3) == lrs_over(b, 3)


# ----------------------------------------------------------------------------- clipping
def test_clip_grad_norm():
    a, b, c = make_param([0.0, 0.0]), make_param([0.0]), make_param([0.0])
    a.grad, b.grad = np.array([3.0, 4.0]), np.array([12.0])   # ||.|| = sqrt(9 + 16 + 144) = 13
    ga = a.grad
    total = optim.clip_grad_norm_([a, b, c], max_norm=6.5)
    assert total == pytest.approx(13.0)
    coef = 6.5 / (13.0 + 1e-6)
    np.testing.assert_allclose(a.grad, [3 * coef, 4 * coef])
    assert a.grad is ga  # scaled in place
    assert optim.clip_grad_norm_([a, b], max_norm=100.0) == pytest.approx(6.5, abs=1e-5)
    np.testing.assert_allclose(b.grad, [12 * coef])  # below max_norm: unchanged


def test_clip_grad_norm_other_norms_and_errors():
    a = make_param([0.0, 0.0])
    a.grad = np.array([3.0, -4.0])
    assert optim.clip_grad_norm_(a, 100.0, norm_type=1) == pytest.approx(7.0)
    assert optim.clip_grad_norm_(a, 100.0, norm_type=float("inf")) == pytest.approx(4.0)
    assert optim.clip_grad_norm_([make_param([1.0])], 1.0) == 0.0  # no grads
    a.grad = np.array([np.inf, 0.0])
    with pytest.raises(RuntimeError, match="total norm"):
        optim.clip_grad_norm_(a, 1.0, error_if_nonfinite=True)


# ----------------------------------------------------------------------------- allocation-free steps
@pytest.mark.parametrize("make", [
    lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01),
    lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True),
    lambda ps: optim.Adam(ps, weight_decay=0.01),
    lambda ps: optim.AdamW(ps),
])
def test_steady_state_steps_allocate_no_arrays(make):
    import tracemalloc
    ps = [make_param(np.zeros((100, 100))) for _ in range(3)]  # 80 KB per array
    for p in ps:
        p.grad = np.ones_like(p.array)
    opt = make(ps)
    opt.step()  # allocates state and work buffers once (dampening's buffer on step 2)
    opt.step()
    tracemalloc.start()
    try:
        opt.step()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8_000, f"a step allocated {peak} bytes; updates must work in place"
