"""resnet_cnn.py ported to minidist: only the imports changed (see README.md).

    .venv/bin/python -m minidist.launch --standalone --nproc-per-node 2 examples/from_torch/resnet_cnn_minidist.py
"""
import argparse
import os

import numpy as np
import minidist as torch
import minidist.distributed as dist
import minidist.nn as nn
import minidist.nn.functional as F
from minidist.nn.parallel import DistributedDataParallel as DDP


def make_images(n, seed):
    """16x16 images of one bar each: horizontal, vertical or either diagonal (4 classes)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 4, n)
    images = rng.normal(0.0, 0.3, size=(n, 1, 16, 16)).astype(np.float32)
    idx = np.arange(16)
    for i, (label, offset) in enumerate(zip(labels, rng.integers(3, 13, n))):
        if label == 0:
            images[i, 0, offset, :] += 1.0
        elif label == 1:
            images[i, 0, :, offset] += 1.0
        elif label == 2:
            images[i, 0, idx, idx] += 1.0
        else:
            images[i, 0, idx, 15 - idx] += 1.0
    return images, labels.astype(np.int64)


class BasicBlock(nn.Module):
    """torchvision's BasicBlock: two 3x3 convolutions, normalization, a shortcut."""

    def __init__(self, inplanes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.GroupNorm(4, planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.GroupNorm(4, planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes, 1, stride=stride, bias=False),
                nn.GroupNorm(4, planes))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    def __init__(self, num_classes=4, width=16):
        super().__init__()
        self.conv1 = nn.Conv2d(1, width, 3, padding=1, bias=False)
        self.bn1 = nn.GroupNorm(4, width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = BasicBlock(width, width)
        self.layer2 = BasicBlock(width, 2 * width, stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(2 * width, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.GroupNorm):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer2(self.layer1(x))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def main():
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = True
    dist.init_process_group(backend="gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(int(os.environ.get("SEED", "0")))
    images, labels = make_images(512, seed=1)
    x = torch.tensor(images[rank::world_size])
    y = torch.tensor(labels[rank::world_size])
    test_x, test_y = make_images(256, seed=2)

    use_amp = torch.cuda.is_available()
    model = DDP(ResNet())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.cuda.amp.GradScaler(enabled=use_amp)
    accum, micro_batch = 2, 16
    steps = int(os.environ.get("STEPS", "40"))
    per_step = accum * micro_batch
    for step in range(steps):
        start = (step * per_step) % (len(x) - per_step + 1)
        total = 0.0
        for micro_step in range(accum):
            # the last micro-step averages the accumulated gradients across ranks (nanoGPT)
            model.require_backward_grad_sync = micro_step == accum - 1
            lo = start + micro_step * micro_batch
            with torch.cuda.amp.autocast(enabled=use_amp):
                loss = F.cross_entropy(model(x[lo:lo + micro_batch]), y[lo:lo + micro_batch])
                loss = loss / accum
            scaler.scale(loss).backward()
            total += loss.item()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        mean_loss = torch.tensor([total])
        dist.all_reduce(mean_loss, op=dist.ReduceOp.SUM)
        if rank == 0 and step % 4 == 3:
            print(f"step {step + 1}: loss {mean_loss.item() / world_size:.4f}", flush=True)
    model.eval()
    with torch.no_grad():
        pred = model(torch.tensor(test_x)).argmax(dim=1)
    accuracy = (pred == torch.tensor(test_y)).float().mean().item()
    if rank == 0:
        print(f"test accuracy {accuracy:.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()
