"""A training job in which rank 1 dies mid-epoch; run by tests/ddp/test_crash_mpi.py.

    mpiexec -n 2 python tests/ddp/crash_rank_script.py DIR --crash-at-call 28   # rank 1 raises
    mpiexec -n 2 python tests/ddp/crash_rank_script.py DIR --resume             # finish the run

Checkpoints go to DIR every epoch; about 10 loss calls make an epoch, so call 28 is inside the
third epoch, after the checkpoints of epochs 1 and 2 were written.
"""

from __future__ import annotations

import argparse

import numpy as np

import minidist
from minidist import comm, nn, optim
from minidist.data import ArrayDataset
from minidist.trainer import Trainer, TrainerConfig


class CrashingLoss(nn.CrossEntropyLoss):
    """Cross-entropy that raises on rank 1 at its ``crash_at``-th call (a stand-in for a bug)."""

    def __init__(self, crash_at: int | None) -> None:
        super().__init__()
        self.crash_at, self.calls = crash_at, 0

    def forward(self, logits, target):
        self.calls += 1
        if self.crash_at is not None and comm.get_rank() == 1 and self.calls == self.crash_at:
            raise RuntimeError(f"injected failure on rank 1 at loss call {self.calls}")
        return super().forward(logits, target)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("ckdir")
    parser.add_argument("--crash-at-call", type=int, default=None)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()
    comm.init_process_group()
    minidist.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    rng = np.random.default_rng(1)
    x = rng.normal(size=(160, 8)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 1).astype(np.int64)
    cfg = TrainerConfig(epochs=4, batch_size=8, seed=3, checkpoint_dir=args.ckdir,
                        checkpoint_every_n_epochs=1, resume=args.resume, verbose=False)
    trainer = Trainer(model, CrashingLoss(args.crash_at_call),
                      optim.SGD(model.parameters(), lr=0.05), cfg)
    trainer.fit(ArrayDataset(x, y))
    if comm.get_rank() == 0:
        print(f"FINISHED start_epoch={trainer.start_epoch}", flush=True)
    trainer.ddp.close()
    comm.destroy_process_group()


if __name__ == "__main__":
    main()
