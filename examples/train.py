"""Train a small classifier with minidist on ONE process: the main job before it goes distributed.

Run (from the repository root):

    OMP_NUM_THREADS=1 python examples/train.py                      # MLP on the embedded digits
    OMP_NUM_THREADS=1 python examples/train.py --model cnn          # small CNN on 1x8x8 images
    python examples/train.py --optimizer adamw --lr 3e-3
    python examples/train.py --dataset synthetic --epochs 5
    python examples/train.py --dataset mnist --data-root ~/data/mnist --epochs 3

Prints one line per epoch (train loss, test accuracy, samples/s, elapsed) and a final
``final test_acc`` line. The pieces, in the order of one step:

    DataLoader (shuffled, seed + epoch) -> model(x) -> CrossEntropyLoss -> backward
    -> optimizer.step() (SGD momentum 0.9, or AdamW) -> scheduler.step() (warm-up + cosine)
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass

from minidist import nn, optim
from minidist import xp as backend
from minidist.data import DataLoader, load_dataset
from minidist.tensor import Tensor, no_grad


@dataclass
class Config:
    epochs: int = 20
    batch_size: int = 32
    lr: float = 0.1           # SGD; use ~3e-3 with --optimizer adamw
    model: str = "mlp"        # mlp | cnn
    optimizer: str = "sgd"    # sgd (momentum 0.9) | adamw
    weight_decay: float = 5e-4
    warmup_steps: int = 20    # linear warm-up, then cosine decay to 0 over all steps
    seed: int = 0
    dataset: str = "digits"   # digits | mnist | fashion-mnist | synthetic
    data_root: str | None = None


def parse_args(argv: list[str] | None = None) -> Config:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    defaults = Config()
    for name, value in vars(defaults).items():
        flag = "--" + name.replace("_", "-")
        kind = type(value) if value is not None else str
        choices = {"model": ["mlp", "cnn"], "optimizer": ["sgd", "adamw"],
                   "dataset": ["digits", "mnist", "fashion-mnist", "synthetic"]}.get(name)
        parser.add_argument(flag, type=kind, default=value, choices=choices)
    return Config(**vars(parser.parse_args(argv)))


# ------------------------------------------------------------------------------- model
def build_model(kind: str, sample_shape: tuple[int, ...], n_classes: int) -> nn.Module:
    """An MLP on flat features, or a CNN on (C, H, W) images."""
    if kind == "mlp":
        (n_features,) = sample_shape
        return nn.Sequential(nn.Linear(n_features, 128), nn.ReLU(),
                             nn.Linear(128, 64), nn.ReLU(),
                             nn.Linear(64, n_classes))
    c, h, w = sample_shape
    return nn.Sequential(nn.Conv2d(c, 16, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(32 * (h // 2) * (w // 2), 64), nn.ReLU(),
                         nn.Linear(64, n_classes))


def build_optimizer(cfg: Config, model: nn.Module) -> optim.Optimizer:
    if cfg.optimizer == "adamw":
        return optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    return optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9, weight_decay=cfg.weight_decay)


# ------------------------------------------------------------------------------- loops
def train_one_epoch(model, loader, loss_fn, opt, sched) -> float:
    """One pass over ``loader``; returns the mean training loss (weighted by batch size)."""
    model.train()
    loss_sum, count = 0.0, 0
    for x, y in loader:
        loss = loss_fn(model(Tensor(x)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        loss_sum += loss.item() * len(y)
        count += len(y)
    return loss_sum / max(count, 1)


def evaluate(model, loader) -> float:
    """Accuracy of ``model`` over ``loader``."""
    model.eval()
    correct, count = 0, 0
    with no_grad():
        for x, y in loader:
            pred = model(Tensor(x)).data.argmax(axis=1)
            correct += int((pred == y).sum())
            count += len(y)
    return correct / max(count, 1)


def main(argv: list[str] | None = None) -> float:
    cfg = parse_args(argv)
    nn.manual_seed(cfg.seed)
    flatten = cfg.model == "mlp"
    kwargs = {} if cfg.dataset == "synthetic" else {"flatten": flatten}
    if cfg.dataset == "synthetic" and cfg.model == "cnn":
        raise SystemExit("train.py: --model cnn needs image data; use --model mlp with synthetic.")
    train_set = load_dataset(cfg.dataset, root=cfg.data_root, split="train", **kwargs)
    test_set = load_dataset(cfg.dataset, root=cfg.data_root, split="test", **kwargs)
    n_classes = int(max(train_set.y.max(), test_set.y.max())) + 1

    model = build_model(cfg.model, train_set.x.shape[1:], n_classes)
    n_params = sum(p.data.size for p in model.parameters())
    train_loader = DataLoader(train_set, batch_size=cfg.batch_size, shuffle=True, seed=cfg.seed)
    test_loader = DataLoader(test_set, batch_size=256)
    loss_fn = nn.CrossEntropyLoss()
    opt = build_optimizer(cfg, model)
    total_steps = cfg.epochs * len(train_loader)
    sched = optim.WarmupCosine(opt, warmup_steps=min(cfg.warmup_steps, total_steps - 1),
                               total_steps=total_steps)
    print(f"{cfg.dataset}: {len(train_set)} train / {len(test_set)} test, model {cfg.model} "
          f"({n_params} params), {cfg.optimizer} lr {cfg.lr}, batch {cfg.batch_size}, "
          f"device {backend.default_device()}", flush=True)

    start, acc = time.perf_counter(), 0.0
    for epoch in range(cfg.epochs):
        train_loader.set_epoch(epoch)
        t0 = time.perf_counter()
        train_loss = train_one_epoch(model, train_loader, loss_fn, opt, sched)
        train_s = time.perf_counter() - t0
        if not math.isfinite(train_loss):  # fail loudly instead of printing NaN for the rest
            raise SystemExit(f"train.py: the training loss is {train_loss} in epoch {epoch + 1}; "
                             f"the run diverged. Lower --lr (now {cfg.lr}).")
        acc = evaluate(model, test_loader)
        print(f"epoch {epoch + 1:3d}/{cfg.epochs}  train_loss {train_loss:.4f}  test_acc {acc:.4f}  "
              f"samples/s {len(train_set) / train_s:8.0f}  elapsed {time.perf_counter() - start:6.2f}s",
              flush=True)
    print(f"final test_acc {acc:.4f}  elapsed {time.perf_counter() - start:.2f}s", flush=True)
    return acc


if __name__ == "__main__":
    main()
