"""A momentum-contrast (MoCo) model trained with DDP, in the mp.spawn shape with a tcp://
rendezvous (the original; torch needed).

    python moco_spawn.py                           # its minidist port: moco_spawn_minidist.py
"""
import argparse
import os

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = int(os.environ.get("STEPS", "60"))
SEED = int(os.environ.get("SEED", "0"))
PORT = int(os.environ.get("PORT", "23456"))
DIM, QUEUE, BATCH, CLASSES = 16, 128, 32, 10


def encoder():
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, DIM))


class MoCo(nn.Module):
    """MoCo v1 without the shuffled BatchNorm: a query encoder, a momentum key encoder and a
    queue of keys (a buffer, as in the paper's code)."""

    def __init__(self, K=QUEUE, m=0.99, T=0.1):
        super().__init__()
        self.K, self.m, self.T = K, m, T
        self.encoder_q = encoder()
        self.encoder_k = encoder()
        for param_q, param_k in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            param_k.data.copy_(param_q.data)
            param_k.requires_grad = False
        self.register_buffer("queue", F.normalize(torch.randn(DIM, K), dim=0))
        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))

    @torch.no_grad()
    def _momentum_update_key_encoder(self):
        for param_q, param_k in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            param_k.data = param_k.data * self.m + param_q.data * (1.0 - self.m)

    @torch.no_grad()
    def _dequeue_and_enqueue(self, keys):
        keys = concat_all_gather(keys)
        batch_size = keys.shape[0]
        ptr = int(self.queue_ptr)
        self.queue[:, ptr:ptr + batch_size] = keys.T
        self.queue_ptr[0] = (ptr + batch_size) % self.K

    def forward(self, im_q, im_k):
        q = F.normalize(self.encoder_q(im_q), dim=1)
        with torch.no_grad():
            self._momentum_update_key_encoder()
            k = F.normalize(self.encoder_k(im_k), dim=1)
        l_pos = torch.einsum("nc,nc->n", [q, k]).unsqueeze(-1)
        l_neg = torch.einsum("nc,ck->nk", [q, self.queue.clone().detach()])
        logits = torch.cat([l_pos, l_neg], dim=1) / self.T
        labels = torch.zeros(logits.shape[0], dtype=torch.long)
        self._dequeue_and_enqueue(k)
        return logits, labels


@torch.no_grad()
def concat_all_gather(tensor):
    tensors_gather = [torch.ones_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(tensors_gather, tensor, async_op=False)
    return torch.cat(tensors_gather, dim=0)


def views(rng, centers):
    """Two noisy views of the same points around ``CLASSES`` centers."""
    x = centers[rng.integers(0, CLASSES, BATCH)] + 0.3 * rng.normal(size=(BATCH, 64))
    return tuple(torch.from_numpy((x + 0.3 * rng.normal(size=x.shape)).astype(np.float32))
                 for _ in range(2))


def main_worker(rank, world_size):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{PORT}", rank=rank,
                            world_size=world_size)
    torch.manual_seed(SEED)
    model = DDP(MoCo())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    criterion = nn.CrossEntropyLoss()
    centers = np.random.default_rng(SEED).normal(size=(CLASSES, 64))
    rng = np.random.default_rng(1000 * SEED + rank + 1)
    for step in range(1, STEPS + 1):
        im_q, im_k = views(rng, centers)
        output, target = model(im_q, im_k)
        loss = criterion(output, target)
        acc = (output.argmax(dim=1) == target).float().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        stats = torch.tensor([loss.item(), acc.item()])
        dist.all_reduce(stats)
        stats /= world_size
        if rank == 0 and step % 10 == 0:
            print(f"step {step}: loss {stats[0].item():.4f} top1 {stats[1].item():.3f}",
                  flush=True)
    queue = model.module.queue.sum().reshape(1)
    high, low = queue.clone(), queue.clone()
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    if rank == 0:
        print(f"queue equal on all ranks: {high.item() == low.item()}", flush=True)
    dist.barrier()  # every rank done before any tears down (gloo aborts a rank whose peer left)
    dist.destroy_process_group()


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    world_size = 2
    mp.spawn(main_worker, args=(world_size,), nprocs=world_size, join=True)
