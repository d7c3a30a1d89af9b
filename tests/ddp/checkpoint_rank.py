"""Checkpoint outcomes agree on every rank under mpiexec; rank 0 prints ``RESULT {...}`` (JSON).

    ./mpirun.sh -n 2 python tests/ddp/checkpoint_rank.py DIR   # test_checkpoint_mpi.py

1. a run diverges (a NaN enters on the last rank only; the all-reduce spreads it): the save
   after that epoch is refused on EVERY rank with the same CheckpointError, nobody hangs, and
   the checkpoints of the good epochs stay;
2. the newest of those is then damaged: resume skips it on rank 0 and every rank resumes from
   the same older checkpoint, with bit-identical parameters;
3. per-rank files (rank0_only=False): one rank's refusal is raised on every rank.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path

import numpy as np

import minidist
from minidist import comm, nn, optim
from minidist.checkpoint import CheckpointError, save_checkpoint
from minidist.data import ArrayDataset
from minidist.trainer import Trainer, TrainerConfig


class PoisonedLoss(nn.CrossEntropyLoss):
    """Cross-entropy that writes a NaN into the last rank's model at its ``at``-th call."""

    def __init__(self, model, at=None):
        super().__init__()
        self.model, self.at, self.calls = model, at, 0

    def forward(self, logits, target):
        self.calls += 1
        if self.calls == self.at and comm.get_rank() == comm.get_world_size() - 1:
            next(iter(self.model.parameters())).array[0, 0] = np.nan
        return super().forward(logits, target)


def run(ckdir, poison_at=None, resume=False):
    minidist.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    rng = np.random.default_rng(1)
    x = rng.normal(size=(160, 8)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64)
    cfg = TrainerConfig(epochs=4, batch_size=8, seed=3, checkpoint_dir=str(ckdir),
                        checkpoint_every_n_epochs=1, resume=resume, verbose=False,
                        allow_nonfinite=True)  # train on through the NaN: the save refuses it
    trainer = Trainer(model, PoisonedLoss(model, poison_at),
                      optim.SGD(model.parameters(), lr=0.05), cfg)
    try:
        trainer.fit(ArrayDataset(x, y))
        return trainer, None
    except CheckpointError as e:
        return trainer, str(e)
    finally:
        trainer.ddp.close()


def digest(model):
    h = hashlib.sha256()
    for a in model.state_dict().values():
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def main(root: Path) -> None:
    comm.init_process_group()
    rank, world = comm.get_rank(), comm.get_world_size()
    steps_per_epoch = math.ceil(math.ceil(160 / world) / 8)  # as DistributedSampler + DataLoader
    _, error = run(root, poison_at=2 * steps_per_epoch + 2)   # inside epoch 3
    errors = comm.all_gather_object(error)
    names = sorted(p.name for p in root.iterdir())
    if rank == 0:
        newest = root / "checkpoint-000002.npz"
        data = newest.read_bytes()
        newest.write_bytes(data[: len(data) // 2])            # damaged after it was written
    comm.barrier()
    trainer, resume_error = run(root, resume=True)
    starts = comm.all_gather_object([trainer.start_epoch, resume_error])
    digests = comm.all_gather_object(digest(trainer.model))
    bad = np.full(2, np.nan if rank == world - 1 else 1.0)
    try:
        save_checkpoint(root / "per_rank" / f"rank{rank}.npz", {"w": bad}, rank0_only=False)
        per_rank = None
    except CheckpointError as e:
        per_rank = str(e)
    per_rank_errors = comm.all_gather_object(per_rank)
    if rank == 0:
        print("RESULT " + json.dumps({"world_size": world, "errors": errors, "files": names,
                                      "resume": starts, "digests": digests,
                                      "per_rank_errors": per_rank_errors}), flush=True)
    comm.barrier()
    comm.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
