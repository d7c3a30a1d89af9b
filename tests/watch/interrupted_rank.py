"""Ranks that are busy or stuck when Ctrl-C comes; run by tests/watch/test_interrupt.py.

    mpiexec -n 2 python tests/watch/interrupted_rank.py train     # both ranks in Trainer.fit
    mpiexec -n 2 python tests/watch/interrupted_rank.py blocked   # both inside blocking MPI calls
    mpiexec -n 2 python tests/watch/interrupted_rank.py restore   # no signal: hooks come and go
    ... interrupted_rank.py stuck     # a KeyboardInterrupt handler that never finishes
    ... interrupted_rank.py rendezvous   # READY before init_process_group: Ctrl-C in the wait
    ... interrupted_rank.py hung all_reduce|barrier   # rank 1 never comes; rank 0 waits

Every rank prints ``READY rank=<r> pid=<pid>.`` once it is where the signal should find it (for
``blocked``: just before the blocking call, which never returns on its own). In ``blocked``
no Python code runs in the main threads, so only the SIGINT watcher thread can end them.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

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


def stuck() -> None:
    """Takes the KeyboardInterrupt and then hangs on its way out: the watcher's backstop must
    end the rank anyway (exit 130)."""
    import time

    print(f"READY rank={comm.get_rank()} pid={os.getpid()}.", flush=True)
    try:
        while True:
            time.sleep(0.05)
    except KeyboardInterrupt:
        time.sleep(600)


def restore() -> None:
    """The SIGINT handler and watcher exist only between init and destroy_process_group."""
    def watchers():
        return [t for t in threading.enumerate() if t.name == "minidist-sigint-watcher"]

    assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    assert len(watchers()) == 1, watchers()
    rank = comm.get_rank()  # after destroy a launched rank has no group to ask (torch raises)
    comm.destroy_process_group()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.set_wakeup_fd(-1) == -1
    for t in watchers():
        t.join(10)
    assert not watchers()
    print(f"restored on rank {rank}", flush=True)
    sys.exit(0)


def hung() -> None:
    """Rank 1 sleeps; the others wait for it in an all-reduce or a barrier."""
    import time

    print(f"READY rank={comm.get_rank()} pid={os.getpid()}.", flush=True)
    if comm.get_rank() == 1:
        time.sleep(600)
    elif sys.argv[2] == "barrier":
        comm.barrier()
    else:
        comm.all_reduce(np.ones(4))


if __name__ == "__main__":
    if sys.argv[1] == "rendezvous":  # the peers never come: Ctrl-C finds it waiting for them
        print(f"READY rank={os.environ.get('RANK', '?')} pid={os.getpid()}.", flush=True)
    comm.init_process_group()
    if sys.argv[1] == "hung":
        hung()
    {"train": train, "blocked": blocked, "restore": restore, "stuck": stuck,
     "rendezvous": lambda: None, "hung": lambda: None}[sys.argv[1]]()
    print("unreachable", flush=True)
