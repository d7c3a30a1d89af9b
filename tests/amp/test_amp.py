"""Mixed precision in one process: autocast's op policy and gradients, GradScaler's scale
trajectory (vs torch's rule, and vs torch.amp.GradScaler when torch is installed), its state
machine and errors, skipped steps, MasterWeights, and AMP training on the digits."""

import logging

import numpy as np
import pytest

import minidist
from minidist import amp, nn, optim
from minidist import xp as backend
from minidist.tensor import Tensor, autocast_mode

F16, F32 = np.dtype(np.float16), np.dtype(np.float32)


def t32(*shape, seed=0, grad=False):
    return Tensor(np.random.default_rng(seed).normal(size=shape).astype(np.float32),
                  requires_grad=grad)


# ---------------------------------------------------------------------- autocast


def test_autocast_defaults_to_torchs_dtype_per_device():
    """torch's defaults: bfloat16 on the CPU, float16 on a GPU (no GPU is needed to ask)."""
    assert amp.autocast("cpu").fast_dtype == minidist.bfloat16
    assert amp.autocast("cuda").fast_dtype == F16
    x, w = t32(4, 6), t32(3, 6, seed=1)
    with amp.autocast("cpu"):
        assert minidist.tensor.linear(x, w).dtype == minidist.bfloat16
    with amp.autocast("cpu", dtype=minidist.float16):
        assert minidist.tensor.linear(x, w).dtype == F16
    torch = pytest.importorskip("torch")
    assert torch.autocast("cpu").fast_dtype == torch.bfloat16       # the behaviour copied


def test_autocast_op_policy_output_dtypes():
    x, w, b = t32(4, 6), t32(3, 6, seed=1), t32(3, seed=2)
    img, k = t32(2, 1, 5, 5), t32(4, 1, 3, 3, seed=3)
    with amp.autocast("cpu", dtype=F16):
        h = minidist.tensor.linear(x, w, b)
        assert h.dtype == F16                                     # lower precision
        assert (x @ w.T).dtype == F16
        assert minidist.tensor.conv2d(img, k, padding=1).dtype == F16
        assert h.relu().dtype == F16                              # runs in its input's dtype
        assert (h + x[:, :3]).dtype == F32                        # float16 + float32: promote
        for y in (h.softmax(), h.log_softmax(), h.exp(), h.sum(), h ** 2, (h * h).log(),
                  minidist.tensor.layer_norm(h, (3,)),
                  minidist.tensor.cross_entropy(h, np.array([0, 1, 2, 0])),
                  minidist.tensor.mse_loss(h, np.zeros((4, 3), np.float32))):
            assert y.dtype == F32, y                              # float32 ops
        d64 = Tensor(np.ones((2, 2)))
        assert (d64 @ d64).dtype == np.float64                    # float64 is not eligible
    assert minidist.tensor.linear(x, w, b).dtype == F32           # off again outside


def test_autocast_nests_restores_and_is_per_device_type():
    x = t32(2, 2)
    assert not amp.is_autocast_enabled("cpu")
    with amp.autocast("cpu", dtype=F16):
        with amp.autocast("cpu", enabled=False):
            assert (x @ x).dtype == F32
        assert (x @ x).dtype == F16 and amp.get_autocast_dtype("cpu") == F16
        with amp.autocast("cuda"):   # NumPy arrays are "cpu": a cuda block leaves them alone
            assert amp.is_autocast_enabled("cuda")
        assert not amp.is_autocast_enabled("cuda")
    with amp.autocast("cuda"):
        assert (x @ x).dtype == F32
    with pytest.raises(KeyError), amp.autocast("cpu", dtype=F16):
        raise KeyError("boom")
    assert not amp.is_autocast_enabled("cpu")                     # restored in finally

    @amp.autocast("cpu", dtype=minidist.float16)
    def f(a):
        return a @ a
    assert f(x).dtype == F16 and (x @ x).dtype == F32
    with pytest.raises(ValueError, match="dtype='float64' is not supported"):
        amp.autocast("cpu", dtype="float64")
    with pytest.raises(ValueError, match="CuPy has no bfloat16"):
        amp.autocast("cuda", dtype="bfloat16")      # the CPU takes it (ml_dtypes)
    with pytest.raises(ValueError, match="device_type='gpu'"):
        amp.autocast("gpu")


def test_cpu_emulation_is_float16_rounding_of_float32_products():
    x, w, b = t32(5, 7), t32(3, 7, seed=1), t32(3, seed=2)
    with amp.autocast("cpu", dtype=F16) as ac:
        out = minidist.tensor.linear(x, w, b)
    assert ac.lower_precision_ops == 1
    r = lambda a: a.astype(np.float16).astype(np.float32)
    expect = (r(x.array) @ r(w.array).T).astype(np.float16) + b.array.astype(np.float16)
    np.testing.assert_array_equal(out.array, expect)
    big = Tensor(np.full((1, 2), 300.0, np.float32))               # 300*300*2 > 65504
    with amp.autocast("cpu", dtype=F16):
        assert np.isinf((big @ big.T).array).all()                  # overflows as on a device


def test_autocast_gradients_flow_through_the_casts():
    x = t32(8, 5, seed=4)
    y = np.arange(8) % 3
    minidist.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 3))
    nn.CrossEntropyLoss()(model(x), y).backward()
    ref = [p.grad.array.copy() for p in model.parameters()]
    model.zero_grad()
    with amp.autocast("cpu", dtype=F16):
        loss = nn.CrossEntropyLoss()(model(x), y)
    loss.backward()
    for p, g in zip(model.parameters(), ref):
        assert p.grad.dtype == F32                                # fp32 param -> fp32 grad
        np.testing.assert_allclose(p.grad, g, rtol=0.05, atol=2e-3)
    xg = t32(3, 4, seed=5, grad=True)                             # and into the input
    with amp.autocast("cpu", dtype=F16):
        (xg @ t32(4, 2, seed=6)).sum().backward()
    assert xg.grad.dtype == F32 and np.isfinite(xg.grad.array).all()


# ---------------------------------------------------------------------- GradScaler


def torch_rule(scale, tracker, found, growth=2.0, backoff=0.5, interval=2000):
    """torch's _amp_update_scale_ (AmpGradScalerKernels.cpp) written out in Python."""
    if found:
        return float(np.float32(scale * backoff)), 0
    t = tracker + 1
    if t == interval:
        new = np.float32(scale * growth)
        return (float(new) if np.isfinite(new) else scale), 0
    return scale, t


SCRIPT = ["ok", "ok", "inf", "ok", "ok", "ok", "nan", "ok", "ok", "ok", "ok", "inf", "inf",
          "ok", "ok", "ok", "ok"]


def snapshot(p):
    return p.detach().numpy().copy() if hasattr(p, "detach") else p.array.copy()


def run_script(scaler, script, make_param, set_grad, step_opt):
    p, opt = make_param()
    out = []
    for kind in script:
        g = {"ok": 0.5, "inf": np.inf, "nan": np.nan}[kind]
        set_grad(p, g, scaler.get_scale())
        before = snapshot(p)
        step_opt(scaler, opt)
        scaler.update()
        after = snapshot(p)
        out.append((scaler.get_scale(), scaler.state_dict()["_growth_tracker"],
                    bool((before != after).any())))
    return out


def ours_param():
    p = nn.Parameter(np.ones(3, np.float32))
    return p, optim.SGD([p], lr=0.1)


def ours_set_grad(scaler):
    def set_grad(p, g, scale):
        loss = scaler.scale((Tensor(np.array([g], np.float32)) * p).sum())  # grad = g * scale
        loss.backward()
    return set_grad


def ours_step(scaler, opt):
    scaler.step(opt)
    opt.zero_grad()


def test_scale_trajectory_follows_torchs_rule():
    scaler = amp.GradScaler(init_scale=2.0 ** 10, growth_interval=3)
    got = run_script(scaler, SCRIPT, ours_param, ours_set_grad(scaler), ours_step)
    scale, tracker = 2.0 ** 10, 0
    for (s, t, moved), kind in zip(got, SCRIPT):
        scale, tracker = torch_rule(scale, tracker, kind != "ok", interval=3)
        assert (s, t) == (scale, tracker) and moved == (kind == "ok"), (kind, s, t)


def test_scale_trajectory_equals_torch_gradscaler():
    torch = pytest.importorskip("torch")
    ts = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=3)

    def make():
        p = torch.nn.Parameter(torch.ones(3))
        return p, torch.optim.SGD([p], lr=0.1)

    def set_grad(p, g, scale):
        ts.scale((torch.tensor([g], dtype=torch.float32) * p).sum()).backward()

    def step(scaler, opt):
        scaler.step(opt)
        opt.zero_grad()

    theirs = run_script(ts, SCRIPT, make, set_grad, step)
    ms = amp.GradScaler(init_scale=2.0 ** 10, growth_interval=3)
    assert run_script(ms, SCRIPT, ours_param, ours_set_grad(ms), ours_step) == theirs
    assert ms.state_dict() == ts.state_dict()
    fresh = amp.GradScaler()
    fresh.load_state_dict(ts.state_dict())                       # torch's keys load as they are
    assert fresh.state_dict() == ts.state_dict()


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_growth_never_reaches_inf():
    scaler = amp.GradScaler(init_scale=float(np.finfo(np.float32).max) / 1.5,
                            growth_interval=1)
    p, opt = ours_param()
    ours_set_grad(scaler)(p, 0.5, None)
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == float(np.float32(np.finfo(np.float32).max / 1.5))
    assert scaler.state_dict()["_growth_tracker"] == 0


@pytest.mark.parametrize("opt_name", ["sgd", "adamw"])
def test_a_skipped_step_changes_neither_parameters_nor_optimizer_state(opt_name):
    minidist.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2))
    opt = (optim.SGD(model.parameters(), lr=0.1, momentum=0.9) if opt_name == "sgd"
           else optim.AdamW(model.parameters(), lr=0.01))
    scaler = amp.GradScaler()
    x, y = t32(5, 4), np.array([0, 1, 0, 1, 1])
    for bad in (False, True):
        xb = x.array.copy()
        if bad:
            xb[2, 1] = np.inf
        with amp.autocast("cpu", dtype=F16):
            loss = nn.CrossEntropyLoss()(model(Tensor(xb)), y)
        scaler.scale(loss).backward()
        params = [p.array.copy() for p in model.parameters()]
        state = {i: {k: (v.copy() if hasattr(v, "copy") else v) for k, v in s.items()}
                 for i, s in opt.state.items()}
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    assert scaler.get_scale() == 2.0 ** 15 and scaler.skipped_steps == 1
    for p, before in zip(model.parameters(), params):
        np.testing.assert_array_equal(p.array, before)
    assert state.keys() == opt.state.keys() and state
    for i, s in state.items():
        for k, v in s.items():
            np.testing.assert_array_equal(opt.state[i][k], v)   # momentum / moments / step


def test_misuse_errors_say_what_to_do():
    p, opt = ours_param()
    scaler = amp.GradScaler()
    with pytest.raises(RuntimeError, match="did not use scaler.scale"):
        scaler.step(opt)
    with pytest.raises(RuntimeError, match="did not use scaler.scale"):
        scaler.update()
    ours_set_grad(scaler)(p, 0.5, None)
    with pytest.raises(RuntimeError, match="No inf checks were recorded prior to update"):
        scaler.update()
    scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="already been called on this optimizer.*once per"):
        scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="Closure use is not currently supported"):
        scaler.step(opt, closure=lambda: 0)
    scaler.step(opt)
    with pytest.raises(RuntimeError, match="after step\\(\\). Call unscale_\\(\\) before"):
        scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="step\\(\\) has already been called.*update"):
        scaler.step(opt)
    scaler.update()
    empty = optim.SGD([nn.Parameter(np.ones(2, np.float32))], lr=0.1)
    scaler.scale(Tensor(np.ones(1, np.float32)))
    with pytest.raises(RuntimeError, match="none of its parameters has a gradient"):
        scaler.step(empty)
    half = nn.Parameter(np.ones(2, np.float16))
    (Tensor(np.ones(2, np.float16)) * half).sum().backward()
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients.*MasterWeights"):
        scaler.unscale_(optim.SGD([half], lr=0.1))
    with pytest.raises(RuntimeError, match="empty.*disabled instance"):
        amp.GradScaler().load_state_dict({})
    with pytest.raises(ValueError, match="growth_factor=0.5"):
        amp.GradScaler(growth_factor=0.5)


def test_disabled_scaler_is_a_pass_through():
    p, opt = ours_param()
    scaler = amp.GradScaler(enabled=False)
    loss = (Tensor(np.ones(3, np.float32)) * p).sum()
    assert scaler.scale(loss) is loss and scaler.get_scale() == 1.0
    loss.backward()
    scaler.step(opt)
    scaler.update()
    assert np.allclose(p.array, 0.9) and scaler.state_dict() == {}
    assert not amp.GradScaler("cuda", enabled=False).is_enabled()


def test_a_cuda_scaler_is_enabled_exactly_when_a_gpu_is_there(caplog):
    """torch's rule: GradScaler("cuda") without CUDA warns once and disables itself."""
    with caplog.at_level("WARNING", logger="minidist.amp.grad_scaler"):
        scaler = amp.GradScaler("cuda", enabled=True)
    assert scaler.is_enabled() is backend.gpu_available()
    warned = "CUDA is not available. Disabling." in caplog.text
    assert warned is not backend.gpu_available(), caplog.text


def test_state_dict_round_trip_and_fp16_loss_is_widened():
    scaler = amp.GradScaler(init_scale=8.0, growth_interval=7)
    out = scaler.scale(Tensor(np.array(3.0, np.float16)))
    assert out.dtype == F32 and out.item() == 24.0
    sd = scaler.state_dict()
    assert sd == {"scale": 8.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                  "growth_interval": 7, "_growth_tracker": 0}
    other = amp.GradScaler()
    other.load_state_dict(sd)
    assert other.state_dict() == sd and other.get_scale() == 8.0


def test_scale_below_the_floor_warns_once_naming_the_parameter(caplog):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(np.ones(2, np.float32))

        def forward(self, x):
            return (x * self.w).sum()

    net = Net()
    opt = optim.SGD(net.parameters(), lr=0.1)
    scaler = amp.GradScaler(init_scale=4.0)
    with caplog.at_level(logging.WARNING, logger="minidist"):
        for _ in range(6):
            scaler.scale(net(Tensor(np.array([np.inf, 1.0], np.float32)))).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
    assert scaler.get_scale() == 4.0 / 64
    warnings = [r.getMessage() for r in caplog.records if "fell to" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "below 1" in warnings[0] and "parameter #0 of the optimizer" in warnings[0]


# ---------------------------------------------------------------------- MasterWeights


def test_master_weights_round_trip():
    minidist.manual_seed(1)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    fp32 = [p.array.copy() for p in model.parameters()]
    opt = amp.MasterWeights(optim.AdamW(model.parameters(), lr=0.01))
    masters = opt.masters()
    for p, m, v in zip(model.parameters(), masters, fp32):
        assert p.dtype == F16 and m.dtype == F32 and m.model is p
        np.testing.assert_array_equal(m.array, v)                  # exact float32 copy
        np.testing.assert_array_equal(p.array, v.astype(np.float16))
    scaler = amp.GradScaler()
    x, y = t32(6, 4), np.array([0, 1, 2, 0, 1, 2])
    for _ in range(3):
        with amp.autocast("cpu", dtype=F16):
            loss = nn.CrossEntropyLoss()(model(x), y)
        scaler.scale(loss).backward()
        assert all(p.grad.dtype == F16 for p in model.parameters())
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    for p, m, v in zip(model.parameters(), masters, fp32):
        assert not np.array_equal(m.array, v)                       # the masters moved
        np.testing.assert_array_equal(p.array, m.array.astype(np.float16))
    sd = opt.state_dict()
    assert len(sd["master_weights"]) == 4 and sd["master_weights"][0].dtype == F32
    minidist.manual_seed(1)
    model2 = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    opt2 = amp.MasterWeights(optim.AdamW(model2.parameters(), lr=0.01))
    opt2.load_state_dict(sd)
    for a, b in zip(opt2.masters(), masters):
        np.testing.assert_array_equal(a.array, b.array)
    for a, b in zip(model2.parameters(), model.parameters()):
        np.testing.assert_array_equal(a.array, b.array)
    assert opt2.state[0]["step"] == 3


def test_master_weights_without_a_scaler_and_its_errors():
    minidist.manual_seed(2)
    model = nn.Linear(3, 2)
    opt = amp.MasterWeights(optim.SGD(model.parameters(), lr=0.5))
    (model(t32(4, 3)).sum()).backward()
    g = model.weight.grad.astype(np.float32)
    w0 = opt.masters()[0].array.copy()
    opt.step()
    np.testing.assert_array_equal(opt.masters()[0].array, w0 - np.float32(0.5) * g)
    with pytest.raises(ValueError, match="already converted"):
        amp.MasterWeights(optim.SGD(model.parameters(), lr=0.1))
    other = nn.Linear(3, 2)
    (other(t32(2, 3)).sum()).backward()
    with pytest.raises(ValueError, match="BEFORE wrapping the model in DistributedDataParallel"):
        amp.MasterWeights(optim.SGD(other.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="is float64"):
        amp.MasterWeights(optim.SGD([nn.Parameter(np.ones(2))], lr=0.1))


# ---------------------------------------------------------------------- DDP seam (1 rank)


def test_ddp_fold_unscales_each_bucket_once(group):
    from minidist.ddp import DistributedDataParallel
    minidist.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    ref = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    ref.load_state_dict(model.state_dict())
    ddp = DistributedDataParallel(model, bucket_cap_mb=1e-4, first_bucket_cap_mb=1e-4)
    scaler = amp.GradScaler()
    x, y = t32(5, 4), np.array([0, 1, 2, 0, 1])
    scaler.scale(nn.CrossEntropyLoss()(ddp(x), y)).backward()
    assert len(scaler._folded) == len(ddp.buckets) > 1            # one kernel call per bucket
    nn.CrossEntropyLoss()(ref(x), y).backward()
    for p, q in zip(model.parameters(), ref.parameters()):       # unscaled, bit for bit
        np.testing.assert_array_equal(p.grad, q.grad)
    with pytest.raises(RuntimeError, match="already unscaled.*no_sync"):
        scaler.scale(nn.CrossEntropyLoss()(ddp(x), y))
    opt = optim.SGD(model.parameters(), lr=0.1)
    scaler.step(opt)
    scaler.update()
    assert amp.active_scaler() is None
    # a step abandoned after scale(): a later backward without the scaler is not unscaled
    other = amp.GradScaler()
    other.scale(nn.CrossEntropyLoss()(ddp(x), y))          # the scaled loss is dropped at once
    assert amp.active_scaler() is None
    model.zero_grad()
    nn.CrossEntropyLoss()(ddp(x), y).backward()
    assert not other._folded
    ddp.close()


# ---------------------------------------------------------------------- training


def test_amp_training_on_digits_converges(group):
    from minidist.data import load_dataset
    from minidist.trainer import Trainer, TrainerConfig
    train = load_dataset("digits", split="train", flatten=True)
    test = load_dataset("digits", split="test", flatten=True)
    minidist.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    trainer = Trainer(model, nn.CrossEntropyLoss(), optim.AdamW(model.parameters(), lr=3e-3),
                      TrainerConfig(epochs=3, batch_size=32, amp=True, verbose=False))
    hist = trainer.fit(train, test)
    assert hist.val_accuracies[-1] >= 0.9 and trainer.scaler.is_enabled()
    assert all(p.dtype == F32 for p in model.parameters())
    trainer.ddp.close()


def test_amp_on_a_model_without_a_float16_path_is_a_clear_error(group):
    from minidist.data import ArrayDataset
    from minidist.trainer import Trainer, TrainerConfig

    class Elementwise(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(np.ones((1, 3), np.float32))

        def forward(self, x):
            return x * self.w

    model = Elementwise()
    data = ArrayDataset(np.ones((8, 3), np.float32), np.zeros(8, np.int64))
    trainer = Trainer(model, nn.CrossEntropyLoss(), optim.SGD(model.parameters(), lr=0.1),
                      TrainerConfig(epochs=1, batch_size=4, amp=True, verbose=False))
    with pytest.raises(ValueError, match="ran no op in float16.*Train without amp"):
        trainer.fit(data)
    trainer.ddp.close()


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request):
    """Run a test body on NumPy ("cpu", in CI) and on CuPy ("cuda", gpu-marked, skipped
    without a GPU): the same assertions, so a wrong expectation fails without a GPU."""
    if request.param == "cuda" and not backend.gpu_available():
        pytest.skip("needs CuPy and a CUDA GPU")
    return request.param


def autocast_and_scaler_steps(device, init_scale, steps):
    """(scale after update, skipped so far, w[0, 0]) after each step of a float16 linear."""
    xp = backend.require_cuda() if device == "cuda" else np
    x = Tensor(xp.ones((4, 8), dtype=xp.float32))
    w = nn.Parameter(xp.full((3, 8), 0.1, dtype=xp.float32))
    scaler = amp.GradScaler(device, init_scale=init_scale)
    opt = optim.SGD([w], lr=0.1)
    history = []
    for _ in range(steps):
        with amp.autocast(device, dtype=F16):
            out = minidist.tensor.linear(x, w)
            assert out.dtype == F16 and backend.is_device_array(out.array) == (device == "cuda")
            loss = out.float().sum()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        assert w.grad.dtype == F32 and backend.get_array_module(scaler._scale) is xp
        opt.zero_grad()
        history.append((scaler.get_scale(), scaler.skipped_steps,
                        float(backend.to_host(w.array)[0, 0])))
    return history


def test_autocast_and_scaler_skip_until_the_float16_grads_fit(device):
    """torch's behaviour: d(sum)/d(out) = scale must fit float16 (max 65504), and so must the
    float16 weight gradient 4 * scale (4 rows of x). 65536 overflows the first, 32768 and
    16384 the second: three skipped steps, the scale halved each time; at 8192 the step is
    taken (w = 0.1 - 0.1 * 4) and the scale stays."""
    got = autocast_and_scaler_steps(device, 2.0 ** 16, 5)
    assert [(s, k) for s, k, _ in got] == [(32768.0, 1), (16384.0, 2), (8192.0, 3),
                                          (8192.0, 3), (8192.0, 3)]
    assert [w for _, _, w in got[:3]] == [pytest.approx(0.1)] * 3
    assert got[3][2] == pytest.approx(0.1 - 0.1 * 4, rel=1e-3)
    assert got[4][2] == pytest.approx(0.1 - 0.1 * 8, rel=1e-3)


def test_autocast_and_scaler_step_taken_at_once(device):
    got = autocast_and_scaler_steps(device, 1024.0, 2)
    assert [(s, k) for s, k, _ in got] == [(1024.0, 0), (1024.0, 0)]
    assert got[0][2] == pytest.approx(-0.3, rel=1e-3) and got[1][2] == pytest.approx(-0.7, rel=1e-3)


def test_policy_lists_name_real_ops():
    ops = set(autocast_mode.POLICY)
    assert {"matmul", "linear", "conv2d", "cross_entropy", "softmax"} <= ops


@pytest.mark.parametrize("master_weights", [False, True])
def test_trainer_amp_resume_is_bit_exact(group, tmp_path, master_weights):
    from minidist.data import ArrayDataset
    from minidist.trainer import Trainer, TrainerConfig
    rng = np.random.default_rng(3)
    x = rng.normal(size=(64, 5)).astype(np.float32)
    data = ArrayDataset(x, (x[:, 0] + x[:, 1] > 0).astype(np.int64))

    def fit(ckdir, resume=False, stop=None):
        minidist.manual_seed(0)
        model = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 2))
        opt = optim.AdamW(model.parameters(), lr=0.01)
        if master_weights:
            opt = amp.MasterWeights(opt)
        scaler = amp.GradScaler(init_scale=2.0 ** 22, growth_interval=3)  # backs off, grows
        t = Trainer(model, nn.CrossEntropyLoss(), opt,
                    TrainerConfig(epochs=4, batch_size=8, amp=True, verbose=False, seed=1,
                                  checkpoint_dir=str(ckdir), checkpoint_every_n_epochs=1,
                                  resume=resume, stop_after_epochs=stop), scaler=scaler)
        t.fit(data)
        t.ddp.close()
        masters = [m.array.copy() for m in opt.masters()] if master_weights else []
        return [a.copy() for a in model.state_dict().values()] + masters, scaler

    straight, s1 = fit(tmp_path / "a")
    fit(tmp_path / "b", stop=2)
    resumed, s2 = fit(tmp_path / "b", resume=True)
    assert s1.skipped_steps > 0 and s1.state_dict() == s2.state_dict()
    for a, b in zip(straight, resumed):
        np.testing.assert_array_equal(a, b)


# ---------------------------------------------------------------------- one launch per step


def test_unscale_is_one_kernel_call_per_step_and_the_flags_reset(monkeypatch):
    """Every gradient of a step goes to ONE foreach call (one flag slot per optimizer); the
    scale update zeroes the flags, so the next step starts clean without a zeroing launch."""
    from minidist import kernels

    calls = []
    real = kernels.foreach_unscale_and_check_
    monkeypatch.setattr(kernels, "foreach_unscale_and_check_",
                        lambda srcs, dsts, inv, found: calls.append(len(srcs)) or
                        real(srcs, dsts, inv, found))
    minidist.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2))
    opt = optim.SGD(model.parameters(), lr=0.1)
    scaler = amp.GradScaler(init_scale=8.0)
    x, y = t32(5, 4), np.array([0, 1, 0, 1, 1])
    for bad in (False, True, False):
        xb = x.array.copy()
        if bad:
            xb[0, 0] = np.nan
        scaler.scale(nn.CrossEntropyLoss()(model(Tensor(xb)), y)).backward()
        scaler.step(opt)
        assert scaler._flags.read().any() == bad
        scaler.update()
        assert not scaler._flags.array.any()
        opt.zero_grad()
    assert calls == [4, 4, 4] and scaler.skipped_steps == 1 and scaler.get_scale() == 4.0


def test_an_abandoned_step_does_not_skip_the_next():
    p, opt = ours_param()
    scaler = amp.GradScaler(init_scale=4.0)
    ours_set_grad(scaler)(p, np.inf, None)
    scaler.unscale_(opt)              # the flag is set ... and the step is abandoned
    scaler._per_optimizer.clear()     # (as after an exception that the loop caught)
    opt.zero_grad()
    ours_set_grad(scaler)(p, 0.5, None)
    scaler.step(opt)
    scaler.update()
    assert scaler.skipped_steps == 0 and np.allclose(p.array, 1 - 0.1 * 0.5)


def test_master_weights_grads_outside_ddp_are_one_flat_buffer():
    minidist.manual_seed(3)
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    opt = amp.MasterWeights(optim.SGD(model.parameters(), lr=0.1))
    scaler = amp.GradScaler(init_scale=2.0)
    scaler.scale(model(t32(2, 3)).float().sum()).backward()
    scaler.step(opt)
    scaler.update()
    flat = opt.master_grad_buffer
    assert flat.size == opt.master_buffer.size
    for m in opt.masters():
        assert np.shares_memory(m.grad, flat)
