"""Data: datasets as arrays, DistributedSampler (which rank reads what), DataLoader (batches).

    from minidist.data import load_dataset, DistributedSampler, DataLoader
    train = load_dataset("digits", split="train")             # embedded, offline
    sampler = DistributedSampler(train, shuffle=True, seed=0)  # rank/world from minidist.comm
    loader = DataLoader(train, batch_size=64, sampler=sampler)
    for epoch in range(10):
        loader.set_epoch(epoch)
        for x, y in loader: ...

Modules: ``datasets`` (Dataset, TensorDataset, ArrayDataset, Subset, random_split,
standardize, load_dataset), ``idx`` (MNIST's file format), ``sampler`` (DistributedSampler),
``collate`` (default_collate: samples -> a batch of Tensors), ``loader`` (DataLoader;
``prefetch``: its worker threads), ``resume`` (mid-epoch checkpoints of both). See
docs/data.md. The same package is ``minidist.utils.data`` (torch's ``torch.utils.data``, with
``.distributed``).
"""

from minidist.data.datasets import (
    ArrayDataset,
    Dataset,
    Subset,
    TensorDataset,
    find_idx_files,
    load_digits,
    load_dataset,
    load_mnist,
    make_classification,
    random_split,
    standardize,
)
from minidist.data.collate import default_collate
from minidist.data.idx import read_idx, write_idx
from minidist.data import distributed
from minidist.data.loader import DataLoader
from minidist.data.sampler import DistributedSampler

__all__ = ["ArrayDataset", "Dataset", "Subset", "TensorDataset", "default_collate", "DataLoader",
           "DistributedSampler",
           "find_idx_files", "load_dataset", "load_digits", "load_mnist", "make_classification",
           "random_split", "read_idx", "standardize", "write_idx"]
