"""A PyTorch DDP training script ported by editing its imports only (rank body).

Everything below the imports is written as it would be for torch.
"""

import sys

import numpy as np

import minidist as torch                                  # was: import torch
import minidist as dist                                   # was: import torch.distributed as dist
import minidist.nn.functional as F                        # was: import torch.nn.functional as F
from minidist import nn, optim                            # was: from torch import nn, optim
from minidist import DistributedDataParallel as DDP       # was: torch.nn.parallel
from minidist.data import DataLoader, DistributedSampler, TensorDataset  # was: torch.utils.data

path = sys.argv[1]
dist.init_process_group()
rank, world = dist.get_rank(), dist.get_world_size()
device = torch.device(f"cuda:{rank}" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)

x = torch.randn(256, 8)
y = (x.sum(1) > 0).long()
dataset = TensorDataset(x, y)
sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
loader = DataLoader(dataset, batch_size=32, sampler=sampler, num_workers=1, pin_memory=True)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 2)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


model = Net().to(device)
ddp = DDP(model, device_ids=None if device.type == "cpu" else [rank])
opt = optim.SGD(ddp.parameters(), lr=0.1)
for epoch in range(3):
    sampler.set_epoch(epoch)
    ddp.train()
    for xb, yb in loader:
        xb, yb = xb.to(device), yb.to(device)
        opt.zero_grad()
        loss = F.cross_entropy(ddp(xb), yb)
        loss.backward()
        opt.step()
ddp.eval()
with torch.no_grad():
    out = ddp(x.to(device))
    correct = out.max(1)[1].eq(y).sum().item()
if rank == 0:
    torch.save({"model": ddp.module.state_dict(), "epoch": 3}, path)
dist.barrier()
state = torch.load(path, map_location="cpu")
fresh = Net()
fresh.load_state_dict(state["model"])
fresh.eval()
same = np.array_equal(fresh(x).numpy(), out.numpy())
digests = dist.all_gather_object(float(np.abs(out.numpy()).sum()))
assert same and len(set(digests)) == 1, (same, digests)
print(f"[rank {rank}] ported script ok, accuracy {correct / len(y):.3f}", flush=True)
ddp.close()
dist.destroy_process_group()
