"""Behaviours checked a second time against oracles that share no code with what they check
(NumPy formulas, a straight run): the sampler's saved order and its epoch-dependent shuffle,
the global generator restored on resume, -inf in the AMP unscale check (also against torch's
unscale where torch is installed)."""

import numpy as np
import pytest

import minidist
from minidist import amp, kernels, nn, optim
from minidist.data import ArrayDataset, DataLoader, DistributedSampler
from minidist.tensor import Tensor
from minidist.tensor import random as tensor_random
from minidist.trainer import Trainer, TrainerConfig

# ---- DistributedSampler


def formula_order(length, n, rank, seed, epoch):
    """torch's DistributedSampler with NumPy's permutation (sampler.py's documented formula):
    pad by repeating the front, then every n-th index from ``rank``."""
    perm = np.random.default_rng(seed + epoch).permutation(length)
    total = -(-length // n) * n
    return np.resize(perm, total)[rank:total:n].tolist()


@pytest.mark.parametrize("length, n", [(10, 1), (23, 2), (50, 4)])
def test_sampler_load_state_dict_then_iterate_gives_the_saved_order(length, n):
    # A stateful-sampler user loads the state and iterates; nothing calls set_epoch after.
    for rank in range(n):
        saved = DistributedSampler(length, num_replicas=n, rank=rank, seed=3)
        saved.set_epoch(5)
        order, state = list(saved), saved.state_dict()
        fresh = DistributedSampler(length, num_replicas=n, rank=rank, seed=3)
        list(fresh)                                   # it was iterating at epoch 0
        fresh.load_state_dict(state)
        assert list(fresh) == order == formula_order(length, n, rank, 3, 5)


def test_loader_shuffle_follows_the_epoch():
    # The order a DataLoader yields over a DistributedSampler, epoch by epoch, against the
    # formula; and no two epochs alike.
    length, n, seed = 40, 2, 7
    x = np.arange(length, dtype=np.float32).reshape(length, 1)
    data = ArrayDataset(x, np.arange(length))
    seen = []
    for rank in range(n):
        sampler = DistributedSampler(data, num_replicas=n, rank=rank, seed=seed)
        loader = DataLoader(data, batch_size=4, sampler=sampler)
        for epoch in range(4):
            loader.set_epoch(epoch)
            got = [int(v) for xb, _ in loader for v in np.asarray(xb).ravel()]
            assert got == formula_order(length, n, rank, seed, epoch), (rank, epoch)
            seen.append(tuple(got))
    assert len(set(seen)) == len(seen)


# ---- the global generator on resume


def blobs(n=48):
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, n)
    x = (rng.normal(size=(n, 5)) + 4 * np.eye(3, 5)[y]).astype(np.float32)
    return ArrayDataset(x, y.astype(np.int64))


def fit(epochs, folder, resume=False, scramble=False):
    minidist.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))
    if scramble:  # whatever the process drew before resuming must not matter
        minidist.manual_seed(12345)
    cfg = TrainerConfig(epochs=epochs, batch_size=8, checkpoint_dir=folder,
                        checkpoint_every_n_epochs=1 if folder else 0, resume=resume,
                        verbose=False)
    t = Trainer(model, nn.CrossEntropyLoss(), optim.SGD(model.parameters(), lr=0.1), cfg)
    t.fit(blobs())
    t.ddp.close()
    return tensor_random.default_generator().bit_generator.state


def test_resume_restores_the_global_generator(group, tmp_path):
    # Oracle: the generator of one straight 3-epoch run, continued with NumPy's own Generator.
    straight = fit(3, None)
    fit(2, str(tmp_path))
    resumed = fit(3, str(tmp_path), resume=True, scramble=True)
    assert resumed == straight
    oracle = np.random.Generator(np.random.PCG64())
    oracle.bit_generator.state = straight
    assert np.array_equal(tensor_random.default_generator().random(8), oracle.random(8))


# ---- -inf in the AMP unscale check


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("n", [1, 2, 17, 1000])
def test_unscale_flags_negative_inf_like_numpy(dtype, n):
    rng = np.random.default_rng(n)
    inv = 1 / 512
    for trial in range(6):
        src = (rng.standard_normal(n) * 50).astype(dtype)
        bad = rng.choice(n, size=min(n, trial), replace=False)
        src[bad] = -np.inf                                   # only -inf: no +inf, no NaN
        want_flag = bool(np.any(~np.isfinite(src)))
        want = src.astype(np.float32) * np.float32(inv)      # NumPy's rounding: the oracle
        dst = np.empty(n, np.float32)
        assert kernels.unscale_and_check(src, dst, inv) is want_flag, (n, bad)
        assert np.array_equal(dst, want)
        found = np.zeros(1, np.float32)
        kernels.foreach_unscale_and_check_([src], [np.empty(n, np.float32)], inv, found)
        assert found[0] == float(want_flag), (n, bad)


def test_grad_scaler_skips_a_step_with_negative_inf():
    nn.manual_seed(0)
    model = nn.Linear(3, 2)
    opt = optim.SGD(model.parameters(), lr=0.1)
    scaler = amp.GradScaler("cpu", init_scale=1024.0)
    before = [p.array.copy() for p in model.parameters()]
    scaler.scale(model(Tensor(np.ones((4, 3), np.float32))).sum()).backward()
    model.weight.grad.array[1, 2] = -np.inf                   # one overflowed gradient
    scaler.step(opt)
    scaler.update()
    assert all(np.array_equal(b, p.array) for b, p in zip(before, model.parameters()))
    assert scaler.get_scale() == 512.0                        # backed off by 0.5


def test_unscale_flags_negative_inf_like_torch():
    torch = pytest.importorskip("torch")
    inv = torch.tensor([1 / 512], dtype=torch.float32)
    for n, pos in ((1, 0), (17, 16), (1000, 333)):
        src = np.linspace(-3, 3, n).astype(np.float32)
        src[pos] = -np.inf
        g, found_t = torch.from_numpy(src.copy()), torch.zeros(1)
        torch._amp_foreach_non_finite_check_and_unscale_([g], found_t, inv)
        dst = np.empty(n, np.float32)
        assert kernels.unscale_and_check(src, dst, 1 / 512) is (found_t.item() == 1.0) is True
        assert np.array_equal(dst, g.numpy())
