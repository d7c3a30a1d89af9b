"""torch's data API: Dataset, TensorDataset, DataLoader(num_workers, collate_fn, ...), model(ndarray)."""

import threading

import numpy as np
import pytest

from minidist import nn
from minidist.data import ArrayDataset, DataLoader, Dataset, DistributedSampler, TensorDataset


class Squares(Dataset):
    def __len__(self):
        return 10

    def __getitem__(self, i):
        return np.float32([i]), np.int64(i * i), np.float32(-i)


def batches(loader):
    return [tuple(np.asarray(f) for f in b) for b in loader]


def test_tensor_dataset_indexes_every_array():
    x, y, w = np.arange(12.0).reshape(6, 2), np.arange(6), np.ones(6)
    ds = TensorDataset(x, y, w)
    assert len(ds) == 6
    a, b, c = ds[4]
    np.testing.assert_array_equal(a, x[4])
    assert (b, c) == (4, 1.0)
    (xb, yb, wb), = batches(DataLoader(ds, batch_size=6))
    np.testing.assert_array_equal(xb, x)
    with pytest.raises(ValueError, match="same first dimension"):
        TensorDataset(x, np.arange(5))


def test_dataset_subclass_with_three_fields_is_stacked_field_by_field():
    (x, y, z), = batches(DataLoader(Squares(), batch_size=10))
    assert x.shape == (10, 1) and y.tolist() == [i * i for i in range(10)]
    np.testing.assert_array_equal(z, -np.arange(10, dtype=np.float32))


@pytest.mark.parametrize("workers, persistent", [(1, False), (3, False), (2, True)])
def test_workers_give_the_same_batches_in_the_same_order(workers, persistent):
    rng = np.random.default_rng(0)
    ds = ArrayDataset(rng.normal(size=(103, 4)), rng.integers(0, 3, 103))
    plain = DataLoader(ds, batch_size=8, shuffle=True, seed=1)
    fast = DataLoader(ds, batch_size=8, shuffle=True, seed=1, num_workers=workers,
                      pin_memory=True, persistent_workers=persistent, prefetch_factor=2)
    for epoch in range(2):
        plain.set_epoch(epoch)
        fast.set_epoch(epoch)
        for (a, b), (c, d) in zip(batches(plain), batches(fast), strict=True):
            np.testing.assert_array_equal(a, c)
            np.testing.assert_array_equal(b, d)
    assert (fast._pool is not None) == persistent
    fast._stop_workers()


def test_workers_run_in_background_threads_and_errors_reach_the_loop():
    seen = set()

    class Where(Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            seen.add(threading.current_thread().name)
            if i == 6:
                raise KeyError("sample 6 is broken")
            return np.float32(i), np.int64(i)

    loader = DataLoader(Where(), batch_size=2, num_workers=2)
    it = iter(loader)
    next(it)
    assert all(name.startswith("minidist-dataloader") for name in seen)
    with pytest.raises(KeyError, match="sample 6"):
        list(it)


def test_leaving_a_loop_early_stops_the_workers():
    loader = DataLoader(TensorDataset(np.arange(100.0)), batch_size=1, num_workers=2)
    for _ in loader:
        break
    assert loader._pool is None


def test_collate_fn_and_worker_init_fn():
    ids = []
    loader = DataLoader(Squares(), batch_size=4, num_workers=2, worker_init_fn=ids.append,
                        collate_fn=lambda samples: {"n": len(samples),
                                                    "x": np.concatenate([s[0] for s in samples])})
    out = list(loader)
    assert [b["n"] for b in out] == [4, 4, 2]
    np.testing.assert_array_equal(np.concatenate([b["x"] for b in out]), np.arange(10))
    assert sorted(ids) == [0, 1]


def test_iter_with_mask_keeps_its_meaning_with_workers():
    ds = ArrayDataset(np.arange(10.0), np.arange(10))
    sampler = DistributedSampler(ds, num_replicas=3, rank=2, shuffle=False)
    loader = DataLoader(ds, batch_size=2, sampler=sampler, num_workers=2)
    masks = [m for _, _, m in loader.iter_with_mask()]
    assert np.concatenate(masks).tolist() == sampler.valid_mask().tolist()


def test_bad_worker_arguments_are_refused():
    ds = TensorDataset(np.ones(3))
    for kwargs, match in [({"num_workers": -1}, "num_workers"),
                          ({"persistent_workers": True}, "needs num_workers > 0"),
                          ({"batch_sampler": [[0]]}, "batch_sampler")]:
        with pytest.raises(ValueError, match=match):
            DataLoader(ds, **kwargs)


def test_modules_and_losses_accept_numpy_arrays():
    nn.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 2))
    x = np.ones((4, 3), np.float32)
    out = model(x)
    np.testing.assert_allclose(out.array, x @ model[0].weight.array.T + model[0].bias.array,
                               rtol=1e-6)
    nn.CrossEntropyLoss()(out, np.array([0, 1, 1, 0])).backward()
    assert model[0].weight.grad is not None


def test_tensor_dataset_against_torch():
    torch = pytest.importorskip("torch")
    x, y = np.arange(10.0).reshape(5, 2), np.arange(5)
    ref = torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
    mine = TensorDataset(x, y)
    for i in range(5):
        assert all(np.array_equal(a.numpy(), b) for a, b in zip(ref[i], mine[i]))
