"""DataLoader batches are Tensors (torch's idioms work on them), default_collate batches what
a Dataset returns as torch's does, Subset/random_split work on any dataset, and the package is
reachable as ``minidist.utils.data``. Compared with torch when it is installed."""

import numpy as np
import pytest

import minidist
from minidist.data import (ArrayDataset, DataLoader, Dataset, Subset, TensorDataset,
                           default_collate, random_split)
from minidist.tensor import Tensor


class Pairs(Dataset):
    """A dataset whose __getitem__ returns minidist Tensors."""

    def __len__(self):
        return 6

    def __getitem__(self, i):
        return minidist.tensor([float(i), 2.0 * i]), minidist.tensor(i % 3)


def test_batches_take_torch_idioms():
    x = np.arange(24, dtype=np.float32).reshape(12, 2)
    loader = DataLoader(TensorDataset(x, np.arange(12) % 3), batch_size=4)
    xb, yb = next(iter(loader))
    assert isinstance(xb, Tensor) and isinstance(yb, Tensor) and not xb.requires_grad
    assert xb.to("cpu") is xb and xb.to(minidist.device("cpu")).size() == (4, 2)
    assert xb.size(0) == 4 and yb.long().dtype == np.int64 and yb.float().dtype == np.float32
    np.testing.assert_array_equal(np.asarray(xb), x[:4])           # the array, no copy
    if not minidist.cuda.is_available():
        with pytest.raises(minidist.DeviceUnavailableError):
            xb.cuda()
    model = minidist.nn.Linear(2, 3)
    loss = minidist.nn.functional.cross_entropy(model(xb.to("cpu")), yb.to("cpu"))
    loss.backward()
    assert model.weight.grad is not None


def test_dataset_of_tensors_is_collated_into_tensors():
    xb, yb = next(iter(DataLoader(Pairs(), batch_size=4)))
    assert xb.dtype == np.float32 and xb.tolist()[3] == [3.0, 6.0]
    assert yb.dtype == np.int64 and yb.tolist() == [0, 1, 2, 0]
    out = minidist.nn.Linear(2, 3)(xb)
    minidist.nn.functional.cross_entropy(out, yb).backward()      # no dtype=object target


def test_collate_refuses_what_it_cannot_batch_with_a_clear_error():
    with pytest.raises(TypeError, match=r"sample\[0\] is a object.*collate_fn"):
        default_collate([(object(), 1), (object(), 2)])
    with pytest.raises(ValueError, match="different shapes"):
        default_collate([np.ones(2), np.ones(3)])
    batch = default_collate([{"x": np.float32(1), "name": "a"}, {"x": np.float32(2), "name": "b"}])
    assert batch["name"] == ["a", "b"] and batch["x"].tolist() == [1.0, 2.0]


def test_subset_and_random_split_work_on_any_dataset():
    parts = random_split(Pairs(), [4, 2], seed=0)
    assert [type(p).__name__ for p in parts] == ["Subset", "Subset"]
    assert sorted(parts[0].indices + parts[1].indices) == list(range(6))
    first = parts[0][0]
    assert first[0].tolist() == Pairs()[parts[0].indices[0]][0].tolist()
    xb, _ = next(iter(DataLoader(parts[0], batch_size=4)))
    assert xb.shape == (4, 2)
    arrays = ArrayDataset(np.arange(10.0)[:, None], np.arange(10))
    sub = Subset(TensorDataset(np.arange(10.0)[:, None], np.arange(10)), [7, 2, 5])
    assert [y.tolist() for _, y in DataLoader(sub, batch_size=2)] == [[7, 2], [5]]
    assert [len(p) for p in random_split(arrays, [0.5, 0.3, 0.2], seed=1)] == [5, 3, 2]
    minidist.manual_seed(3)
    a = random_split(Pairs(), [3, 3])[0].indices
    minidist.manual_seed(3)
    assert random_split(Pairs(), [3, 3])[0].indices == a    # follows manual_seed, as torch


def test_utils_data_is_the_data_package():
    import minidist.utils.data as udata
    from minidist.utils.data.distributed import DistributedSampler

    assert minidist.utils.data is udata is minidist.data
    assert DistributedSampler is minidist.data.DistributedSampler
    assert minidist.utils.data.DataLoader is DataLoader


def test_collate_matches_torch():
    torch = pytest.importorskip("torch")
    from torch.utils.data import default_collate as torch_collate

    samples = [(np.float32([i, 2 * i]), i, float(i) / 2, np.int32(i), True) for i in range(3)]
    ours, theirs = default_collate(samples), torch_collate(samples)
    for a, b in zip(ours, theirs):
        assert a.dtype == np.dtype(str(b.dtype).replace("torch.", ""))
        np.testing.assert_array_equal(np.asarray(a), b.numpy())
    tsamples = [(torch.tensor([float(i)]), torch.tensor(i)) for i in range(3)]
    msamples = [(minidist.tensor([float(i)]), minidist.tensor(i)) for i in range(3)]
    for a, b in zip(default_collate(msamples), torch_collate(tsamples)):
        np.testing.assert_array_equal(np.asarray(a), b.numpy())
        assert a.shape == tuple(b.shape)


def test_random_split_lengths_match_torch():
    torch = pytest.importorskip("torch")
    for n, fractions in [(10, [0.5, 0.3, 0.2]), (7, [1 / 3] * 3), (11, [0.9, 0.1])]:
        ours = [len(p) for p in random_split(list(range(n)), fractions, seed=0)]
        theirs = [len(p) for p in torch.utils.data.random_split(list(range(n)), fractions)]
        assert ours == theirs
