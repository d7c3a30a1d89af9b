"""A training step makes no device-to-host transfer (the CPU twin of gpu_check's sync count).

Every host transfer the library makes goes through ``minidist.xp.to_host``, which counts it on
NumPy arrays too, so these tests check on the CPU what a GPU step does: fp32 steps make none,
an AMP step makes exactly the scaler's one (as torch's GradScaler.step). The sync debug mode
(torch.cuda.set_sync_debug_mode) flags each implicit transfer by op name.
"""

import warnings

import numpy as np
import pytest

import minidist
from minidist import amp, nn, optim
from minidist import xp as backend
from minidist.tensor import Tensor
from minidist.tensor import losses as F


def mlp(seed=0):
    minidist.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 10))


def batch(seed=0, n=24):
    rng = np.random.default_rng(seed)
    return Tensor(rng.normal(size=(n, 16)).astype(np.float32)), rng.integers(0, 10, size=n)


OPTIMIZERS = {
    "sgd": lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9),
    "sgd_fused": lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9, fused=True),
    "adamw": lambda ps: optim.AdamW(ps, lr=1e-3),
    "adamw_fused": lambda ps: optim.AdamW(ps, lr=1e-3, fused=True),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_fp32_step_makes_no_host_transfer(name):
    model = mlp()
    opt = OPTIMIZERS[name](model.parameters())
    x, y = batch()
    for step in range(3):  # the first step allocates state; later ones must be as quiet
        with backend.count_host_transfers() as counts:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        assert counts == {}, f"step {step}: {dict(counts)}"
    with backend.count_host_transfers() as counts:
        loss.item()  # asked for: counted, by its own name
    assert counts == {"item": 1}


def test_amp_step_makes_only_the_scalers_host_transfer():
    model = mlp()
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = amp.GradScaler()
    x, y = batch()
    for step in range(3):
        with backend.count_host_transfers() as counts:
            with amp.autocast("cpu", dtype=amp.float16):
                loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        assert counts == {"GradScaler.step": 1}, f"step {step}: {dict(counts)}"


def test_sync_debug_mode_names_the_op_and_leaves_explicit_reads_alone():
    model = mlp()
    opt = optim.SGD(model.parameters(), lr=0.1)
    scaler = amp.GradScaler()
    x, y = batch()
    assert minidist.cuda.get_sync_debug_mode() == 0
    try:
        minidist.cuda.set_sync_debug_mode("error")
        assert minidist.cuda.get_sync_debug_mode() == 2
        loss = F.cross_entropy(model(x), y)   # fp32: nothing to flag
        loss.backward()
        opt.step()
        assert np.isfinite(loss.item())       # asked for: never flagged
        with amp.autocast("cpu", dtype=amp.float16):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        with pytest.raises(minidist.cuda.SyncDebugError, match="GradScaler.step"):
            scaler.step(opt)
        minidist.cuda.set_sync_debug_mode(1)
        with pytest.warns(UserWarning, match="GradScaler.step: an implicit device-to-host"):
            scaler.step(opt)
        scaler.update()
        with pytest.raises(ValueError, match="unknown mode"):
            minidist.cuda.set_sync_debug_mode("loud")
    finally:
        minidist.cuda.set_sync_debug_mode("default")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        backend.to_host(np.zeros(2), op="an op")  # default mode: silent


# ---------------------------------------------------------------------- the GPU's cross-entropy


def reference(logits, t, ignore_index, reduction):
    x = Tensor(logits, requires_grad=True)
    loss = F.cross_entropy(x, t, ignore_index=ignore_index, reduction=reduction)
    (loss.sum() if reduction == "none" else loss).backward()
    return loss.numpy(), x.grad.numpy() if hasattr(x.grad, "numpy") else np.asarray(x.grad)


def on_device(logits, t, ignore_index, reduction):
    x = Tensor(logits, requires_grad=True)
    loss = F.cross_entropy_on_device(x, np.asarray(t), ignore_index, reduction)
    (loss.sum() if reduction == "none" else loss).backward()
    return loss.numpy(), x.grad.numpy() if hasattr(x.grad, "numpy") else np.asarray(x.grad)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("ignored", [False, True])
def test_cross_entropy_on_device_matches_the_reference(reduction, ignored):
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(12, 7)).astype(np.float32) * 3
    t = rng.integers(0, 7, size=12)
    if ignored:
        t[[2, 5]] = -100
    got, gg = on_device(logits, t, -100, reduction)
    want, wg = reference(logits, t, -100, reduction)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(gg, wg, rtol=1e-6, atol=1e-7)
    if not ignored and reduction != "mean":  # the same operations: the same bits
        np.testing.assert_array_equal(got, want)


def test_cross_entropy_on_device_makes_a_bad_label_nan_not_a_wrong_loss():
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(6, 4)).astype(np.float32)
    t = np.array([0, 1, 4, 3, -100, 2])
    per_row, _ = on_device(logits, t, -100, "none")
    assert np.isnan(per_row[2]) and np.isfinite(np.delete(per_row, 2)).all()
    assert np.isnan(on_device(logits, t, -100, "mean")[0])
    with pytest.raises(ValueError, match="outside"):  # the CPU checks on the host, as before
        F.cross_entropy(Tensor(logits), t)
