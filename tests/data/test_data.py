"""Datasets, the IDX reader and DataLoader."""

import gzip

import numpy as np
import pytest

from minidist.data import (
    ArrayDataset,
    DataLoader,
    DistributedSampler,
    load_dataset,
    load_digits,
    random_split,
    read_idx,
    standardize,
    write_idx,
)


# ----------------------------------------------------------------------------- ArrayDataset & helpers
def test_array_dataset_int_and_batch_indexing():
    ds = ArrayDataset(np.arange(12).reshape(6, 2), np.arange(6) * 10)
    assert len(ds) == 6
    x, y = ds[2]
    assert x.tolist() == [4, 5] and y == 20
    xb, yb = ds[np.array([5, 0])]
    assert xb.tolist() == [[10, 11], [0, 1]] and yb.tolist() == [50, 0]
    with pytest.raises(ValueError, match=r"x has shape \(6, 2\) and y has shape \(5,\)"):
        ArrayDataset(np.zeros((6, 2)), np.zeros(5))


def test_random_split_lengths_fractions_and_seed():
    ds = ArrayDataset(np.arange(10), np.arange(10))
    a, b = random_split(ds, [0.7, 0.3], seed=1)
    assert (len(a), len(b)) == (7, 3)
    assert sorted(a.x.tolist() + b.x.tolist()) == list(range(10))
    assert (a.x == a.y).all()  # rows stay paired
    a2, _ = random_split(ds, [7, 3], seed=1)
    assert a2.x.tolist() == a.x.tolist()
    assert random_split(ds, [0.5, 0.5], seed=2)[0].x.tolist() != random_split(ds, [0.5, 0.5], seed=3)[0].x.tolist()
    assert [len(p) for p in random_split(ds, [1 / 3] * 3)] == [4, 3, 3]
    with pytest.raises(ValueError, match="sum to 9"):
        random_split(ds, [4, 5])
    with pytest.raises(ValueError, match="sum to 1"):
        random_split(ds, [0.5, 0.6])


def test_standardize_uses_train_statistics():
    x = np.array([[1.0, 10.0], [3.0, 30.0]])
    z, mean, std = standardize(x)
    np.testing.assert_allclose(z, [[-1, -1], [1, 1]], atol=1e-6)
    z2, _, _ = standardize(np.array([[2.0, 20.0]]), mean, std)
    np.testing.assert_allclose(z2, [[0, 0]], atol=1e-6)
    assert z.dtype == np.float32


# ----------------------------------------------------------------------------- built-in datasets
def test_digits_split_is_fixed_stratified_and_disjoint():
    tr, te, full = (load_digits(split=s) for s in ("train", "test", "all"))
    assert (len(tr), len(te), len(full)) == (1438, 359, 1797)
    assert tr.x.dtype == np.float32 and tr.y.dtype == np.int64 and tr.x.shape[1] == 64
    assert 0.0 <= tr.x.min() and tr.x.max() == 1.0
    counts = np.bincount(te.y, minlength=10)
    assert counts.min() >= 35 and counts.max() <= 37  # about 20% of every class
    # disjoint: every row of `all` is in exactly one split (compare rows as bytes)
    rows = lambda d: {r.tobytes() + bytes([c]) for r, c in zip(d.x, d.y)}  # noqa: E731
    assert len(rows(tr) & rows(te)) <= 2  # the raw data has a couple of identical images
    assert np.array_equal(load_digits(split="test").x, te.x)  # deterministic
    img = load_digits(split="test", flatten=False, normalize=False)
    assert img.x.shape == (359, 1, 8, 8) and img.x.max() == 16.0


def test_load_dataset_names_and_errors():
    assert len(load_dataset("digits", split="test")) == 359
    syn_tr = load_dataset("synthetic", n_samples=200, n_features=5, n_classes=3, seed=4)
    syn_te = load_dataset("synthetic", split="test", n_samples=200, n_features=5, n_classes=3, seed=4)
    # stratified 80/20: round(0.2 * 67), round(0.2 * 67), round(0.2 * 66) = 13 + 13 + 13 test samples
    assert syn_tr.x.shape == (161, 5) and len(syn_te) == 39 and set(syn_tr.y.tolist()) == {0, 1, 2}
    with pytest.raises(ValueError, match="known names are"):
        load_dataset("cifar10")
    with pytest.raises(ValueError, match="unknown split 'val'"):
        load_dataset("digits", split="val")
    with pytest.raises(ValueError, match="needs root="):
        load_dataset("mnist")


def test_synthetic_is_learnable_by_nearest_class_mean():
    tr = load_dataset("synthetic", n_samples=1000, n_features=10, n_classes=4, seed=0)
    te = load_dataset("synthetic", split="test", n_samples=1000, n_features=10, n_classes=4, seed=0)
    means = np.stack([tr.x[tr.y == c].mean(0) for c in range(4)])
    pred = np.argmin(((te.x[:, None, :] - means[None]) ** 2).sum(-1), axis=1)
    assert (pred == te.y).mean() > 0.9


# ----------------------------------------------------------------------------- IDX files
@pytest.mark.parametrize("gz", [False, True])
def test_mnist_from_idx_files(tmp_path, gz):
    rng = np.random.default_rng(0)
    suffix = ".gz" if gz else ""
    arrays = {}
    for stem, n in (("train", 6), ("t10k", 4)):
        imgs = rng.integers(0, 256, size=(n, 3, 5), dtype=np.uint8)
        lbls = rng.integers(0, 10, size=n, dtype=np.uint8)
        write_idx(tmp_path / f"{stem}-images-idx3-ubyte{suffix}", imgs)
        write_idx(tmp_path / f"{stem}-labels-idx1-ubyte{suffix}", lbls)
        arrays[stem] = (imgs, lbls)
    if gz:
        assert (tmp_path / "train-images-idx3-ubyte.gz").read_bytes()[:2] == b"\x1f\x8b"
    tr = load_dataset("mnist", root=tmp_path)
    assert tr.x.shape == (6, 15) and tr.x.dtype == np.float32
    np.testing.assert_allclose(tr.x * 255, arrays["train"][0].reshape(6, 15))
    assert tr.y.tolist() == arrays["train"][1].tolist()
    te = load_dataset("fashion-mnist", root=tmp_path, split="test", flatten=False)
    assert te.x.shape == (4, 1, 3, 5)
    assert len(load_dataset("mnist", root=tmp_path, split="all")) == 10


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32, np.float32, np.float64])
def test_idx_round_trip_every_dtype(tmp_path, dtype):
    a = (np.arange(24).reshape(2, 3, 4) - 5).astype(dtype)
    write_idx(tmp_path / "a.idx", a)
    b = read_idx(tmp_path / "a.idx")
    assert b.dtype == np.dtype(dtype) and np.array_equal(a, b)
    # the header is big-endian, as the format says
    raw = (tmp_path / "a.idx").read_bytes()
    assert raw[3] == 3 and raw[4:8] == (2).to_bytes(4, "big")


def test_idx_errors_name_the_file_and_byte_counts(tmp_path):
    good = tmp_path / "good-idx3-ubyte"
    write_idx(good, np.zeros((10, 4, 4), dtype=np.uint8))
    raw = good.read_bytes()                      # 16 header bytes + 160 data bytes
    cut = tmp_path / "cut-idx3-ubyte"
    cut.write_bytes(raw[:100])
    with pytest.raises(ValueError, match=r"cut-idx3-ubyte is truncated: .* needs 176 bytes but the file has 100"):
        read_idx(cut)
    head = tmp_path / "head"
    head.write_bytes(raw[:10])
    with pytest.raises(ValueError, match=r"header declares 3 dimensions \(16 header bytes\) but the file has 10"):
        read_idx(head)
    bad = tmp_path / "bad"
    bad.write_bytes(b"\x12\x34\x08\x01" + raw[4:])
    with pytest.raises(ValueError, match=r"bad does not start with an IDX magic number: got bytes 12 34 08 01"):
        read_idx(bad)
    gz = tmp_path / "cut.gz"
    noisy = np.random.default_rng(0).integers(0, 256, size=(10, 4, 4), dtype=np.uint8)
    packed = gzip.compress(raw[:16] + noisy.tobytes())
    gz.write_bytes(packed[: len(packed) // 2])
    with pytest.raises(ValueError, match="cut.gz is a gzip file that cannot be decompressed"):
        read_idx(gz)
    with pytest.raises(ValueError, match="tiny"):
        (tmp_path / "tiny").write_bytes(b"\x00\x00")
        read_idx(tmp_path / "tiny")
    with pytest.raises(FileNotFoundError, match="no train-images-idx3-ubyte or train-images-idx3-ubyte.gz"):
        load_dataset("mnist", root=tmp_path)


# ----------------------------------------------------------------------------- DataLoader
def test_loader_batches_len_and_drop_last():
    ds = ArrayDataset(np.arange(10, dtype=np.float32)[:, None], np.arange(10))
    loader = DataLoader(ds, batch_size=4)
    batches = list(loader)
    assert len(loader) == 3 and [len(y) for _, y in batches] == [4, 4, 2]
    assert np.concatenate([y for _, y in batches]).tolist() == list(range(10))
    assert batches[0][0].shape == (4, 1)
    dl = DataLoader(ds, batch_size=4, drop_last=True)
    assert len(dl) == 2 and [len(y) for _, y in dl] == [4, 4]
    with pytest.raises(ValueError, match="batch_size=0"):
        DataLoader(ds, batch_size=0)
    with pytest.raises(ValueError, match="sampler decides the order"):
        DataLoader(ds, shuffle=True, sampler=DistributedSampler(ds, 1, 0))


def test_loader_shuffle_changes_per_pass_and_follows_set_epoch():
    ds = ArrayDataset(np.arange(50), np.arange(50))
    loader = DataLoader(ds, batch_size=50, shuffle=True, seed=3)
    first, second = [next(iter(loader))[1].tolist() for _ in range(2)]
    assert first != second and sorted(first) == list(range(50))
    loader.set_epoch(0)
    assert next(iter(loader))[1].tolist() == first
    assert first == np.random.default_rng(3).permutation(50).tolist()


def test_loader_with_distributed_sampler_and_masks():
    ds = ArrayDataset(np.arange(10), np.arange(10))
    seen = []
    for r in range(4):
        sampler = DistributedSampler(ds, num_replicas=4, rank=r, seed=0)
        loader = DataLoader(ds, batch_size=2, sampler=sampler)
        loader.set_epoch(2)
        assert sampler.epoch == 2 and len(loader) == 2
        for x, y, valid in loader.iter_with_mask():
            seen += y[valid].tolist()
        assert [y.tolist() for _, y in loader] == [sampler.local_indices()[:2].tolist(),
                                                   sampler.local_indices()[2:].tolist()]
    assert sorted(seen) == list(range(10))  # masks drop the 2 padded duplicates


def test_loader_generic_dataset_is_stacked():
    class Squares:
        def __len__(self):
            return 5

        def __getitem__(self, i):
            return np.array([i, i * i]), i

    x, y = next(iter(DataLoader(Squares(), batch_size=3)))
    assert x.tolist() == [[0, 0], [1, 1], [2, 4]] and y.tolist() == [0, 1, 2]
