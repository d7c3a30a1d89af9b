"""A training job in which rank 1 dies mid-epoch; run by tests/ddp/test_crash_mpi.py.

    mpiexec -n 2 python tests/ddp/crash_rank.py DIR --crash-in-epoch 3   # rank 1 raises
    mpiexec -n 2 python tests/ddp/crash_rank.py DIR --resume             # finish the run

Checkpoints go to DIR every epoch. Rank 1 raises in the middle of the given epoch (its loss
call is computed from the steps per epoch), after the checkpoints of the epochs before it.
"""

from __future__ import annotations

import argparse
import math

import numpy as np

import minidist
from minidist import comm, nn, optim
from minidist.data import ArrayDataset
from minidist.trainer import Trainer, TrainerConfig


class CrashingLoss(nn.CrossEntropyLoss):
    """Cross-entropy that raises on rank 1 halfway through ``epoch`` (a stand-in for a bug).

    Only training calls the loss this way (no validation set here), ``steps_per_epoch`` calls
    per epoch.
    """

    def __init__(self, epoch: int | None, steps_per_epoch: int) -> None:
        super().__init__()
        self.epoch, self.steps, self.calls = epoch, steps_per_epoch, 0
        self.crash_at = None if epoch is None else (epoch - 1) * steps_per_epoch + \
            steps_per_epoch // 2 + 1

    def forward(self, logits, target):
        self.calls += 1
        if self.crash_at is not None and comm.get_rank() == 1 and self.calls == self.crash_at:
            raise RuntimeError(f"injected failure on rank 1 in epoch {self.epoch} (loss call "
                               f"{self.calls}, {self.steps} per epoch)")
        return super().forward(logits, target)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("ckdir")
    parser.add_argument("--crash-in-epoch", type=int, default=None)
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
    steps_per_epoch = math.ceil(len(x) / comm.get_world_size() / cfg.batch_size)
    trainer = Trainer(model, CrashingLoss(args.crash_in_epoch, steps_per_epoch),
                      optim.SGD(model.parameters(), lr=0.05), cfg)
    trainer.fit(ArrayDataset(x, y))
    if comm.get_rank() == 0:
        print(f"FINISHED start_epoch={trainer.start_epoch}", flush=True)
    trainer.ddp.close()
    comm.destroy_process_group()


if __name__ == "__main__":
    main()
