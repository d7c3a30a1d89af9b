"""A small DCGAN trained with DDP, in the torchrun shape (the original; torch needed).

    torchrun --standalone --nproc_per_node 2 gan_dcgan.py       # its port: gan_dcgan_minidist.py
"""
import argparse
import os

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = int(os.environ.get("STEPS", "80"))
SEED = int(os.environ.get("SEED", "0"))
NZ, BATCH = 8, 32


def bars(n, rng):
    """8x8 images in [-1, 1]: one bright horizontal or vertical bar on a dark field."""
    imgs = np.full((n, 1, 8, 8), -1.0, dtype=np.float32)
    pos = rng.integers(1, 7, n)
    for i, (p, vertical) in enumerate(zip(pos, rng.random(n) < 0.5)):
        if vertical:
            imgs[i, 0, :, p] = 1.0
        else:
            imgs[i, 0, p, :] = 1.0
    return imgs


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(NZ, 32, 4, 1, 0, bias=False),      # 1x1 -> 4x4
            nn.BatchNorm2d(32),
            nn.ReLU(True),
            nn.ConvTranspose2d(32, 1, 4, 2, 1, bias=False),       # 4x4 -> 8x8
            nn.Tanh(),
        )

    def forward(self, z):
        return self.main(z)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(1, 32, 4, 2, 1, bias=False),                # 8x8 -> 4x4
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(32, 1, 4, 1, 0, bias=False),                # 4x4 -> 1x1
            nn.Sigmoid(),
        )

    def forward(self, x):
        return self.main(x).view(-1, 1)


def weights_init(m):
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        nn.init.normal_(m.weight.data, 0.0, 0.02)
    elif classname.find("BatchNorm") != -1:
        nn.init.normal_(m.weight.data, 1.0, 0.02)
        nn.init.constant_(m.bias.data, 0)


def main():
    dist.init_process_group(backend="gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(SEED)
    netG = DDP(Generator().apply(weights_init))
    netD = DDP(Discriminator().apply(weights_init))
    criterion = nn.BCELoss()
    optD = optim.Adam(netD.parameters(), lr=2e-3, betas=(0.5, 0.999))
    optG = optim.Adam(netG.parameters(), lr=2e-3, betas=(0.5, 0.999))
    rng = np.random.default_rng(1000 * SEED + rank)               # each rank its own batches
    real_label, fake_label = 1.0, 0.0
    for step in range(1, STEPS + 1):
        real = torch.from_numpy(bars(BATCH, rng))
        noise = torch.randn(BATCH, NZ, 1, 1)
        fake = netG(noise)
        # (1) the discriminator: real images -> 1, generated ones -> 0, in one batch
        optD.zero_grad()
        images = torch.cat([real, fake.detach()], dim=0)
        labels = torch.cat([torch.full((BATCH, 1), real_label),
                            torch.full((BATCH, 1), fake_label)], dim=0)
        errD = criterion(netD(images), labels)
        errD.backward()
        optD.step()
        # (2) the generator: make the discriminator answer 1
        optG.zero_grad()
        output = netD(fake)
        errG = criterion(output, torch.full((BATCH, 1), real_label))
        errG.backward()
        optG.step()
        losses = torch.tensor([errD.item(), errG.item(), output.mean().item()])
        dist.all_reduce(losses, op=dist.ReduceOp.SUM)
        losses /= world_size
        if rank == 0 and step % 10 == 0:
            print(f"step {step}: d_loss {losses[0].item():.4f} g_loss {losses[1].item():.4f} "
                  f"D(G(z)) {losses[2].item():.3f}", flush=True)
    with torch.no_grad():
        sample = netG.module(torch.randn(256, NZ, 1, 1))
        bright = (sample > 0).float().sum(dim=(2, 3)).mean().item()   # a bar lights 8 pixels
        total = torch.cat([p.detach().flatten() for p in netG.parameters()]).sum().reshape(1)
    high, low = total.clone(), total.clone()
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    if rank == 0:
        print(f"bright pixels per sample {bright:.1f}, generator weights equal on all ranks: "
              f"{high.item() == low.item()}", flush=True)
    dist.barrier()  # every rank done before any tears down (gloo aborts a rank whose peer left)
    dist.destroy_process_group()


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()
