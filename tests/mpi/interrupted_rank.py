"""Ranks that are busy or stuck when Ctrl-C comes; run by tests/test_interrupt.py.

    mpiexec -n 2 python tests/mpi/interrupted_rank.py train     # both ranks in Trainer.fit
    mpiexec -n 2 python tests/mpi/interrupted_rank.py blocked   # both inside blocking MPI calls

Every rank prints ``READY rank=<r> pid=<pid>.`` once it is where the signal should find it (for
``blocked``: just before the blocking call, which never returns on its own). In ``blocked``
no Python code runs in the main threads, so only the SIGINT watcher thread can end them.
"""

from __future__ import annotations

import os
import sys

import numpy as np

from minidist import comm, nn, optim
from minidist.data import ArrayDataset
from minidist.trainer import Trainer, TrainerConfig


class ReadyLoss(nn.CrossEntropyLoss):
    """Cross-entropy that announces the rank once training is under way."""

    def forward(self, logits, target):
        if not getattr(self, "announced", False):
            self.announced = True
            print(f"READY rank={comm.get_rank()} pid={os.getpid()}.", flush=True)
        return super().forward(logits, target)


def train() -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 8)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    Trainer(model, ReadyLoss(), optim.SGD(model.parameters(), lr=0.01),
            TrainerConfig(epochs=100_000, batch_size=8, verbose=False)).fit(ArrayDataset(x, y))


def blocked() -> None:
    from mpi4py import MPI

    world = MPI.COMM_WORLD.Dup()
    print(f"READY rank={comm.get_rank()} pid={os.getpid()}.", flush=True)
    if comm.get_rank() == 0:
        world.Barrier()                    # rank 1 never comes
    else:
        world.Recv(np.zeros(1), source=0)  # rank 0 never sends


if __name__ == "__main__":
    comm.init_process_group()
    {"train": train, "blocked": blocked}[sys.argv[1]]()
    print("unreachable", flush=True)
