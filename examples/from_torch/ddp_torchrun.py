"""A PyTorch DDP training script in the usual torchrun shape (the original; torch needed).

    torchrun --nproc_per_node 2 ddp_torchrun.py           # its minidist port: ddp_torchrun_minidist.py
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(10, 32)
        self.bn = nn.BatchNorm1d(32)
        self.fc2 = nn.Linear(32, 2)

    def forward(self, x):
        return self.fc2(F.relu(self.bn(self.fc1(x))))


def main():
    dist.init_process_group(backend="gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    x = torch.randn(512, 10)
    y = (x[:, 0] + x[:, 1] > 0).long()
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)

    model = DDP(Net())
    optimizer = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for epoch in range(5):
        sampler.set_epoch(epoch)
        model.train()
        total = torch.zeros(2)
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            optimizer.step()
            total += torch.tensor([loss.item() * len(yb), len(yb)])
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        if rank == 0:
            print(f"epoch {epoch}: loss {total[0].item() / total[1].item():.4f}", flush=True)

    model.eval()
    with torch.no_grad():
        correct = model(x).argmax(1).eq(y).sum().item()
    if rank == 0:
        print(f"accuracy {correct / len(y):.3f}", flush=True)
        path = os.environ.get("SAVE_TO", os.path.join("runs", "ddp_torchrun_model.pt"))
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        torch.save(model.module.state_dict(), path)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()
