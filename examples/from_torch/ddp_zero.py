"""A PyTorch DDP script with a map-style Dataset of tensors, activation checkpointing and
ZeroRedundancyOptimizer, in the torchrun shape (the original; torch needed).

    torchrun --nproc_per_node 2 ddp_zero.py           # its minidist port: ddp_zero_minidist.py
"""
import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class Quadrants(Dataset):
    """Points in 8-D, labelled by the sign of x0 * x1; each sample is a pair of tensors."""

    def __init__(self, n):
        self.x = torch.randn(n, 8)
        self.y = (self.x[:, 0] * self.x[:, 1] > 0).long()

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(8, 64)
        self.block = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.head = nn.Linear(64, 2)

    def forward(self, x):
        h = F.relu(self.stem(x))
        h = h + checkpoint(self.block, h, use_reentrant=False)  # recomputed in backward
        return self.head(h)


def main():
    dist.init_process_group(backend="gloo")
    rank = dist.get_rank()
    if torch.accelerator.is_available():
        device = torch.accelerator.current_accelerator()
    else:
        device = torch.device("cpu")
    torch.manual_seed(0)
    dataset = Quadrants(1024)
    sampler = DistributedSampler(dataset, shuffle=True)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)

    model = DDP(Net().to(device))
    optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=optim.Adam, lr=1e-2)
    for epoch in range(6):
        sampler.set_epoch(epoch)
        model.train()
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
        if rank == 0:
            print(f"epoch {epoch}: loss {loss:.4f}", flush=True)

    model.eval()
    with torch.no_grad():
        pred = model(dataset.x.to(device)).argmax(1)
        accuracy = pred.eq(dataset.y.to(device)).float().mean()
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    low, high = weights.sum().reshape(1), weights.sum().reshape(1)
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(f"accuracy {accuracy:.3f}", flush=True)
        print(f"weights equal on all ranks: {low.item() == high.item()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()
