"""A PyTorch DDP training script in the usual mp.spawn shape (the original; torch needed).

    python ddp_spawn.py                                   # its minidist port: ddp_spawn_minidist.py
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def setup(rank, world_size):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = "12355"
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def cleanup():
    dist.destroy_process_group()


def demo_basic(rank, world_size):
    setup(rank, world_size)
    torch.manual_seed(0)
    model = ToyModel()
    ddp_model = DDP(model)
    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.01)
    inputs, labels = torch.randn(20, 10), torch.randn(20, 5)
    for step in range(10):
        optimizer.zero_grad()
        loss = loss_fn(ddp_model(inputs + rank), labels)
        loss.backward()
        optimizer.step()
    high = ddp_model.module.net2.weight.detach().sum().reshape(1)
    low = high.clone()
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    same = high.item() == low.item()
    if rank == 0:
        print(f"rank {rank}: loss {loss.item():.4f}, weights equal on all ranks: {same}", flush=True)
    cleanup()


def run_demo(demo_fn, world_size):
    mp.spawn(demo_fn, args=(world_size,), nprocs=world_size, join=True)


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    run_demo(demo_basic, 2)
