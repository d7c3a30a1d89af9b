"""Trainer checks on every rank under mpiexec; rank 0 prints ``RESULT {...}`` (JSON).

    ./mpirun.sh -n 2 python tests/ddp/trainer_rank.py DIR   # tests/ddp/test_trainer_mpi.py

1. resume is exact: 4 epochs straight == 2 epochs + checkpoint + a NEW Trainer that resumes
   + 2 more epochs, bit for bit (model, and the history of losses);
2. evaluate() counts every sample once: at world size n on a set that n does not divide (the
   sampler pads), it equals the single-process loss/accuracy computed here without DDP;
3. a checkpoint for another model is refused with a clear error and overwrites nothing;
4. ranks that pass datasets of different lengths get a clear error, not a hang.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np

import minidist
from minidist import comm, nn, optim
from minidist.checkpoint import CheckpointError
from minidist.data import ArrayDataset
from minidist.tensor import Tensor, no_grad
from minidist.trainer import Trainer, TrainerConfig


def build(hidden=16):
    minidist.manual_seed(0)
    return nn.Sequential(nn.Linear(8, hidden), nn.ReLU(), nn.Linear(hidden, 3))


def dataset(n, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 8)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 1).astype(np.int64)
    return ArrayDataset(x, y)


def run(ckdir, epochs, resume=False, hidden=16, stop=None):
    model = build(hidden)
    opt = optim.AdamW(model.parameters(), lr=0.01)
    cfg = TrainerConfig(epochs=epochs, batch_size=8, seed=3, grad_accum_steps=2,
                        schedule="cosine", warmup_steps=3, lr_scaling="sqrt",
                        checkpoint_dir=str(ckdir), checkpoint_every_n_epochs=1, resume=resume,
                        stop_after_epochs=stop,
                        validation_split=0.2, verbose=False)
    trainer = Trainer(model, nn.CrossEntropyLoss(), opt, cfg)
    hist = trainer.fit(dataset(203, 1))
    trainer.ddp.close()
    return model, hist, trainer


def digest(model):
    h = hashlib.sha256()
    for a in model.state_dict().values():
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def main(root: Path) -> None:
    comm.init_process_group()
    rank, world = comm.get_rank(), comm.get_world_size()
    res = {"world_size": world}
    straight, h1, _ = run(root / "straight", 4)
    run(root / "split", 4, stop=2)    # a job that hit its time limit after 2 epochs
    resumed, h2, t2 = run(root / "split", 4, resume=True)
    res["resume_bit_identical"] = digest(straight) == digest(resumed)
    res["resume_history_same"] = h1.train_losses == h2.train_losses and \
        h1.val_accuracies == h2.val_accuracies
    res["resume_start_epoch"] = t2.start_epoch
    res["ranks_identical"] = len(set(comm.all_gather_object(digest(resumed)))) == 1

    # evaluate() vs a plain single-process computation on the whole set (every rank computes it)
    test = dataset(101, 2)  # 101 % 2 and 101 % 4 != 0: the sampler pads
    loss, acc = t2.evaluate(test)
    with no_grad():
        out = resumed(Tensor(test.x))
        ref_loss = float(nn.CrossEntropyLoss()(out, test.y).item())
        ref_acc = float((out.array.argmax(-1) == test.y).mean())
    res["eval"] = [loss, acc, ref_loss, ref_acc]

    # a checkpoint of a different model: clear error, nothing changed or overwritten
    before = {p.name: p.stat().st_mtime_ns for p in (root / "split").iterdir()}
    try:
        run(root / "split", 5, resume=True, hidden=17)
        res["wrong_model_error"] = ""
    except CheckpointError as e:
        res["wrong_model_error"] = str(e)
    after = {p.name: p.stat().st_mtime_ns for p in (root / "split").iterdir()}
    res["nothing_overwritten"] = before == after

    # 4. a rank that loaded a different dataset: the same clear error on every rank, no hang
    model = build()
    trainer = Trainer(model, nn.CrossEntropyLoss(), optim.SGD(model.parameters(), lr=0.1),
                      TrainerConfig(epochs=1, batch_size=8, verbose=False))
    try:
        trainer.fit(dataset(203 + (60 if rank == world - 1 else 0), 1))
        res["dataset_mismatch_error"] = ""
    except RuntimeError as e:
        res["dataset_mismatch_error"] = str(e)
    trainer.ddp.close()
    if rank == 0:
        print("RESULT " + json.dumps(res), flush=True)
    comm.barrier()
    comm.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
