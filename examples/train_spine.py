"""The main job's model and data on the spine alone: the README tour's plain loop, no Trainer.

Run (from the repository root):

    MINIDIST_WINGS=none ./mpirun.sh -n 4 python examples/train_spine.py --algorithm ring
    MINIDIST_WINGS=none .venv/bin/python examples/train_spine.py --threads 4
    ./mpirun.sh -n 4 python examples/train_spine.py        # every wing loaded (the default)

``MINIDIST_WINGS=none`` loads no wing (minidist/wings.py): the textbook all-reduces over the MPI
or thread transport, no shared-memory fast path, no ``auto`` cost model. What one step does on
every rank, each file a page of the spine (docs/layout.md's reading table):

    DistributedSampler (seed + epoch, one shard per rank)       data/sampler.py
    -> model(x): Linear-ReLU-Linear                             nn/, tensor/linalg.py
    -> CrossEntropyLoss -> loss.backward()                      tensor/losses.py, autograd.py
       (DDP all-reduces each gradient bucket as it fills)       ddp/reducer.py, comm/
    -> Adam                                                     optim/adam.py

``--threads N`` runs N ranks as threads of this process (the threads transport), each with its
own process group; under ``mpirun.sh`` each rank is a process. Rank 0 prints one line per epoch
and ``final test_acc``: the accuracy on the test split, the same on every rank. With
``--deterministic`` (docs/determinism.md) both launches end at the same bits on any machine
(``tests/test_spine.py`` checks the 0.97 bar there); without it the BLAS kernel the process
picks moves the last digits, a few test images either way.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one BLAS thread per rank (ranks share cores)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import threading

import numpy as np

import minidist as md
from minidist import nn, optim
from minidist.comm.transports.threads import run_threads
from minidist.data import DataLoader, DistributedSampler, load_digits


INIT_LOCK = threading.Lock()


def train(group: md.ProcessGroup, args: argparse.Namespace) -> float:
    """Train on ``group``'s ranks; return the test accuracy (every rank gets the same)."""
    with INIT_LOCK:  # thread ranks share one global RNG: seed and draw one rank at a time
        md.manual_seed(args.seed)  # the same initial weights everywhere (DDP broadcasts too)
        model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                              nn.Linear(256, 10))  # the main job's MLP (examples/train.py)
    ddp = md.DistributedDataParallel(model, process_group=group)
    opt = optim.Adam(model.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()
    train_set, test_set = load_digits("train"), load_digits("test")
    sampler = DistributedSampler(train_set, num_replicas=group.size, rank=group.rank,
                                 shuffle=True, seed=args.seed)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
        for x, y in loader:
            opt.zero_grad()
            loss = loss_fn(ddp(md.Tensor(x)), y)
            loss.backward()  # buckets are all-reduced while backward runs
            opt.step()  # every rank ends with bit-identical parameters
        if group.rank == 0:
            print(f"epoch {epoch}: last batch loss {loss.item():.4f}", flush=True)
    ddp.close()
    with md.no_grad():  # every rank holds the same weights: each scores the whole test split
        logits = model(md.Tensor(test_set.x)).numpy()
    return float(np.mean(logits.argmax(axis=1) == test_set.y))


def main(argv: list[str] | None = None) -> float:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--algorithm", default="auto",
                   help="all-reduce algorithm: ring, tree, rd, direct or auto (default; with "
                        "MINIDIST_WINGS=none auto runs ring)")
    p.add_argument("--threads", type=int, default=0, metavar="N",
                   help="run N thread ranks in this process instead of one rank per process")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=16, help="per rank")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--deterministic", action="store_true",
                   help="the same bits on any machine (docs/determinism.md)")
    args = p.parse_args(argv)
    md.use_deterministic_algorithms(args.deterministic)
    if args.threads:
        accs = run_threads(args.threads, lambda t: train(
            md.new_group_from_transport(t, algorithm=args.algorithm), args), timeout_s=600)
        acc = accs[0]
    else:
        group = md.init_process_group(algorithm=args.algorithm)
        acc = train(group, args)
        rank = group.rank
        md.destroy_process_group()
    if args.threads or rank == 0:
        print(f"final test_acc {acc:.4f}", flush=True)
    return acc


if __name__ == "__main__":
    main()
