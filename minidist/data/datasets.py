"""Datasets as pairs of arrays: ArrayDataset, splitting, standardizing, and the built-in sets.

    train = load_dataset("digits", split="train")          # embedded, works offline
    test = load_dataset("digits", split="test")
    x, y = train[0]                                        # one sample
    xb, yb = train[np.array([3, 1, 4])]                    # a batch by fancy indexing
    mnist = load_dataset("mnist", root="~/data/mnist")     # IDX files you downloaded
    blobs = load_dataset("synthetic", n_samples=2000, n_features=16, n_classes=5)

Built-in sets (``load_dataset(name)``)::

    name            samples (train/test)   features          source
    digits          1438 / 359             64 (8x8), 10 cls  embedded digits.npz (UCI, CC BY 4.0)
    mnist           60000 / 10000          784 (28x28)       IDX files in ``root``
    fashion-mnist   60000 / 10000          784 (28x28)       IDX files in ``root``
    synthetic       80% / 20% of n_samples n_features        Gaussian blobs, seeded

Features are float32 (pixels scaled to [0, 1]), labels int64. ``flatten=False`` gives images
as (N, 1, H, W) for convolutions. Splits are deterministic: the same seed gives the same split
on every rank and every run, which DistributedSampler relies on.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from minidist.data.idx import read_idx
from minidist.tensor import Tensor, default_generator

DIGITS_FILE = Path(__file__).with_name("digits.npz")
SPLITS = ("train", "test", "all")


class Dataset:
    """torch's map-style dataset: subclass it and define ``__getitem__`` and ``__len__``.

        class Squares(Dataset):
            def __len__(self): return 10
            def __getitem__(self, i): return np.float32([i]), np.int64(i * i)

    A sample is usually a tuple ``(x, y)`` (any length works); DataLoader stacks each field.
    """

    def __getitem__(self, index: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define __getitem__.")

    def __len__(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} must define __len__.")


class TensorDataset(Dataset):
    """Samples ``(a[i], b[i], ...)`` from arrays or Tensors with the same first dimension.

    torch's ``TensorDataset``: ``TensorDataset(x, y)[3] == (x[3], y[3])``, a tuple of Tensors
    (without gradient) as in torch. Arrays are stored as they are (Tensors as their host
    arrays, in ``.tensors``); DataLoader batches it with one fancy-indexing step per array.

    Raises:
        ValueError: no arrays, a 0-d array, or different first dimensions.
    """

    def __init__(self, *tensors: Any) -> None:
        arrays = tuple(np.asarray(t.numpy() if hasattr(t, "numpy") else t) for t in tensors)
        if not arrays or any(a.ndim == 0 for a in arrays) or len({len(a) for a in arrays}) > 1:
            raise ValueError(f"TensorDataset: got shapes {[a.shape for a in arrays]}; pass at "
                             "least one array, all with the same first dimension (one row per "
                             "sample).")
        self.tensors = arrays

    def __len__(self) -> int:
        return len(self.tensors[0])

    def __getitem__(self, index: Any) -> tuple[Tensor, ...]:
        return tuple(Tensor(a[index]) for a in self.tensors)


class ArrayDataset(Dataset):
    """Samples ``(x[i], y[i])`` from two host arrays with the same first dimension.

    ``ds[i]`` gives one sample; ``ds[index_array]`` gives a whole batch in one fancy-indexing
    step (what DataLoader uses: no per-sample Python loop).

    Args:
        x: features, shape (N, ...).
        y: targets, shape (N, ...).

    Raises:
        ValueError: x and y have different lengths.
    """

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        x, y = np.asarray(x), np.asarray(y)
        if x.ndim == 0 or y.ndim == 0 or len(x) != len(y):
            raise ValueError(f"ArrayDataset: x has shape {x.shape} and y has shape {y.shape}; "
                             "both need the same first dimension (one row per sample).")
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: Any) -> tuple[np.ndarray, np.ndarray]:
        return self.x[index], self.y[index]

    def __repr__(self) -> str:
        return (f"ArrayDataset(n={len(self)}, x={self.x.shape} {self.x.dtype}, "
                f"y={self.y.shape} {self.y.dtype})")


def _split_lengths(n: int, sizes: Sequence[float]) -> list[int]:
    if all(isinstance(s, (int, np.integer)) for s in sizes):
        lengths = [int(s) for s in sizes]
        if sum(lengths) != n or min(lengths) < 0:
            raise ValueError(f"random_split: lengths {lengths} sum to {sum(lengths)}, but the "
                             f"dataset has {n} samples. Give lengths that sum to {n}, or "
                             "fractions.")
        return lengths
    if min(sizes) < 0 or abs(sum(sizes) - 1.0) > 1e-6:
        raise ValueError(f"random_split: fractions {list(sizes)} sum to {sum(sizes)}; they must be "
                         ">= 0 and sum to 1, e.g. [0.8, 0.2].")
    lengths = [int(np.floor(n * f)) for f in sizes]
    for i in range(n - sum(lengths)):  # hand out the remainder round-robin, as torch does
        lengths[i % len(lengths)] += 1
    return lengths


class Subset(Dataset):
    """torch's ``Subset(dataset, indices)``: the samples of ``dataset`` at ``indices``.

    Works on any map-style dataset (``len`` + ``__getitem__``). DataLoader batches a Subset of
    an ArrayDataset or TensorDataset with one fancy-indexing step per array, like the whole.
    """

    def __init__(self, dataset: Any, indices: Sequence[int]) -> None:
        self.dataset, self.indices = dataset, indices
        self._array: np.ndarray | None = None

    def index_array(self) -> np.ndarray:
        """``indices`` as an int64 array (made once)."""
        if self._array is None:
            self._array = np.asarray(self.indices, dtype=np.int64).reshape(-1)
        return self._array

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, list):
            return self.dataset[[int(self.index_array()[i]) for i in index]]
        return self.dataset[self.index_array()[index]]

    def __len__(self) -> int:
        return len(self.indices)


def random_split(dataset: Any, lengths: Sequence[float], generator: Any = None, *,
                 seed: int | None = None) -> list[Any]:
    """Split a dataset at random into parts of the given lengths or fractions (torch's).

    Args:
        dataset: any map-style dataset.
        lengths: lengths that sum to ``len(dataset)``, or fractions that sum to 1 (the
            remainder handed out round-robin, as torch does).
        generator: a ``numpy.random.Generator`` to draw the permutation from.
        seed: instead of ``generator``: ``numpy.random.default_rng(seed)``; the same seed gives
            the same split on every rank and every run. With neither, the split comes from
            minidist's default generator, as torch's from its own: it follows
            ``minidist.manual_seed`` and, without it, differs per process.

    Returns:
        For an ArrayDataset: one ArrayDataset per part (copies made by fancy indexing, sorted
        by index). For any other dataset: one ``Subset`` per part (torch's result).
    """
    sizes = _split_lengths(len(dataset), lengths)
    if generator is None:
        if seed is not None:
            generator = np.random.default_rng(seed)
        else:
            generator = default_generator()
    perm = generator.permutation(len(dataset))
    out: list[Any] = []
    start = 0
    for length in sizes:
        part = perm[start:start + length]
        start += length
        if isinstance(dataset, ArrayDataset):
            out.append(ArrayDataset(*dataset[np.sort(part)]))
        else:
            out.append(Subset(dataset, part.tolist()))
    return out


def standardize(x: np.ndarray, mean: np.ndarray | None = None, std: np.ndarray | None = None,
                eps: float = 1e-8) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-feature ``(x - mean) / std``; pass the training set's mean/std to transform the test set.

    Returns:
        ``(x_standardized as float32, mean, std)``.
    """
    x = np.asarray(x, dtype=np.float32)
    if mean is None:
        mean = x.mean(axis=0)
    if std is None:
        std = x.std(axis=0)
    return ((x - mean) / (std + eps)).astype(np.float32), mean, std


def _check_split(name: str, split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"load_dataset({name!r}): unknown split {split!r}; use one of {SPLITS}.")


def _stratified_test_mask(labels: np.ndarray, test_fraction: float, seed: int) -> np.ndarray:
    """A boolean mask choosing round(test_fraction * n_c) samples of every class c for the test
    set."""
    rng = np.random.default_rng(seed)
    mask = np.zeros(len(labels), dtype=bool)
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        mask[rng.permutation(idx)[: int(round(test_fraction * len(idx)))]] = True
    return mask


def _take_split(x: np.ndarray, y: np.ndarray, split: str, seed: int) -> ArrayDataset:
    if split == "all":
        return ArrayDataset(x, y)
    test = _stratified_test_mask(y, 0.2, seed)
    keep = test if split == "test" else ~test
    return ArrayDataset(x[keep], y[keep])


def load_digits(split: str = "train", normalize: bool = True, flatten: bool = True,
                seed: int = 0) -> ArrayDataset:
    """The embedded UCI 8x8 digits: 1797 images, 10 classes, a fixed stratified 80/20 split.

    Args:
        split: "train" (1438 samples), "test" (359) or "all" (1797).
        normalize: scale pixels 0..16 to [0, 1] (else keep 0..16 as float32).
        flatten: x of shape (N, 64); else (N, 1, 8, 8) for a CNN.
        seed: seeds the split (the default 0 is the split every example and test uses).

    Returns:
        ArrayDataset with float32 x and int64 y.
    """
    _check_split("digits", split)
    with np.load(DIGITS_FILE, allow_pickle=False) as f:
        images, labels = f["images"], f["labels"]
    x = images.astype(np.float32)
    if normalize:
        x /= 16.0
    x = x.reshape(len(x), 64) if flatten else x.reshape(len(x), 1, 8, 8)
    return _take_split(x, labels.astype(np.int64), split, seed)


IDX_NAMES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
             "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
TORCHVISION_DIRS = {"mnist": "MNIST", "fashion-mnist": "FashionMNIST"}
# Where the four IDX files of each set can be downloaded (the .gz files work as they are).
DOWNLOAD_FROM = {"mnist": "https://ossci-datasets.s3.amazonaws.com/mnist/ (torchvision's mirror)",
                 "fashion-mnist": "https://github.com/zalandoresearch/fashion-mnist (data/fashion)"}


def _find_idx(name: str, root: Path, stem: str) -> Path:
    folders = [root, root / TORCHVISION_DIRS[name] / "raw", root / "raw"]
    for folder in folders:
        for candidate in (folder / stem, folder / (stem + ".gz")):
            if candidate.exists():
                return candidate
    raise FileNotFoundError(f"load_dataset({name!r}): no {stem} or {stem}.gz in {root} (also "
                            f"looked in {[str(f) for f in folders[1:]]}). Download the four IDX "
                            "files of "
                            f"{name} from {DOWNLOAD_FROM[name]} into that folder, or point at "
                            "the folder that has them.")


def find_idx_files(name: str, root: str | os.PathLike, split: str = "all") -> list[Path]:
    """The IDX files ``load_dataset(name, root, split)`` would read, without reading them.

    For checking a data folder before starting a job (examples/train.py does, before
    init_process_group). ``name`` is "mnist" or "fashion-mnist".

    Raises:
        ValueError: unknown name or split.
        FileNotFoundError: a file is missing (the message says where to download it).
    """
    key = name.lower().replace("_", "-")
    if key not in TORCHVISION_DIRS:
        raise ValueError(f"find_idx_files: {name!r} is not an IDX dataset; use one of "
                         f"{sorted(TORCHVISION_DIRS)}.")
    _check_split(name, split)
    root = Path(root).expanduser()
    parts = ("train", "test") if split == "all" else (split,)
    return [_find_idx(key, root, stem) for part in parts for stem in IDX_NAMES[part]]


def load_mnist(root: str | os.PathLike, split: str = "train", name: str = "mnist",
               flatten: bool = True) -> ArrayDataset:
    """MNIST or Fashion-MNIST from the IDX files in ``root`` (``.gz`` or not; torchvision's
    ``root/MNIST/raw`` layout works too). ``split="all"`` concatenates train and test.

    Returns:
        ArrayDataset with float32 x in [0, 1] ((N, 784), or (N, 1, 28, 28) unflattened), int64 y.
    """
    _check_split(name, split)
    root = Path(root).expanduser()
    xs, ys = [], []
    for part in (("train", "test") if split == "all" else (split,)):
        img_stem, lbl_stem = IDX_NAMES[part]
        images = read_idx(_find_idx(name, root, img_stem))
        labels = read_idx(_find_idx(name, root, lbl_stem))
        if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
            raise ValueError(f"load_dataset({name!r}): {img_stem} has shape {images.shape} and "
                             f"{lbl_stem} has shape {labels.shape}; expected (N, H, W) images and "
                             "N labels. The files do not belong together.")
        xs.append(images)
        ys.append(labels)
    images, labels = np.concatenate(xs), np.concatenate(ys)
    x = images.astype(np.float32) / 255.0
    n, h, w = images.shape
    x = x.reshape(n, h * w) if flatten else x.reshape(n, 1, h, w)
    return ArrayDataset(x, labels.astype(np.int64))


def make_classification(n_samples: int = 1000, n_features: int = 20, n_classes: int = 4,
                        seed: int = 0, class_sep: float = 2.0) -> ArrayDataset:
    """Gaussian blobs: class c is ``center_c + N(0, 1)`` with ``center_c ~ class_sep * N(0, I)``.

    Learnable (a linear model separates it when class_sep is large) and fully determined by
    ``seed``. Labels are balanced (``i % n_classes``, then shuffled).
    """
    if n_samples < 1 or n_features < 1 or n_classes < 2:
        raise ValueError(f"make_classification: need n_samples >= 1, n_features >= 1, "
                         f"n_classes >= 2; got {n_samples}, {n_features}, {n_classes}.")
    rng = np.random.default_rng(seed)
    centers = class_sep * rng.standard_normal((n_classes, n_features))
    y = rng.permutation(np.arange(n_samples) % n_classes).astype(np.int64)
    x = centers[y] + rng.standard_normal((n_samples, n_features))
    return ArrayDataset(x.astype(np.float32), y)


def load_dataset(name: str, root: str | os.PathLike | None = None, split: str = "train",
                 **kwargs: Any) -> ArrayDataset:
    """Load a built-in dataset by name (see the table in the module docstring).

    Args:
        name: "digits", "mnist", "fashion-mnist" or "synthetic".
        root: folder with the IDX files (mnist, fashion-mnist only).
        split: "train", "test" or "all".
        **kwargs: passed on: ``flatten`` (digits, mnist), ``normalize``/``seed`` (digits),
            ``n_samples``, ``n_features``, ``n_classes``, ``seed``, ``class_sep`` (synthetic).

    Raises:
        ValueError: unknown name or split, or root missing for a file-backed dataset.
    """
    key = name.lower().replace("_", "-")
    _check_split(name, split)
    if key == "digits":
        return load_digits(split=split, **kwargs)
    if key in TORCHVISION_DIRS:
        if root is None:
            raise ValueError(f"load_dataset({name!r}): needs root=, a folder with the IDX files "
                             f"({', '.join(IDX_NAMES['train'] + IDX_NAMES['test'])}, optionally "
                             f".gz; get them from {DOWNLOAD_FROM[key]}). Or use the embedded "
                             "'digits', which needs no download.")
        return load_mnist(root, split=split, name=key, **kwargs)
    if key == "synthetic":
        blobs = make_classification(**kwargs)
        return _take_split(blobs.x, blobs.y, split, kwargs.get("seed", 0))
    raise ValueError(f"load_dataset: unknown dataset {name!r}; known names are "
                     f"{['digits', 'mnist', 'fashion-mnist', 'synthetic']}.")
