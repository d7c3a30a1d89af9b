"""Mid-epoch resume with the Trainer (rank body); rank 0 prints ``RESULT {...}``.

    ./mpirun.sh -n 2 python tests/ddp/midepoch_rank.py DIR   # tests/ddp/test_midepoch_mpi.py

Three runs of the same job (AdamW, cosine schedule, dropout, grad accumulation 2, 3 epochs of
13 batches per rank): straight through; stopped after 8 optimizer steps (mid-epoch 2, with
checkpoint_every_n_steps=4); resumed from that checkpoint. The resumed run must end with the
straight run's parameters bit for bit, and must not repeat the batches done before the stop.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np

import minidist
from minidist import comm, nn, optim
from minidist.data import ArrayDataset
from minidist.trainer import Trainer, TrainerConfig


def run(ckdir: Path | None, resume: bool = False, stop: int | None = None):
    minidist.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 3))
    opt = optim.AdamW(model.parameters(), lr=0.01)
    cfg = TrainerConfig(epochs=3, batch_size=8, seed=3, grad_accum_steps=2, schedule="cosine",
                        warmup_steps=2, checkpoint_dir=str(ckdir) if ckdir else None,
                        checkpoint_every_n_steps=4 if ckdir else 0, resume=resume,
                        stop_after_steps=stop, verbose=False)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(203, 8)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 1).astype(np.int64)
    trainer = Trainer(model, nn.CrossEntropyLoss(), opt, cfg)
    trainer.fit(ArrayDataset(x, y))
    trainer.ddp.close()
    h = hashlib.sha256()
    for a in model.state_dict().values():
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest(), trainer.global_step


def main() -> None:
    comm.init_process_group()
    ckdir = Path(sys.argv[1])
    straight, steps = run(None)
    stopped, stop_step = run(ckdir, stop=8)
    saved = sorted(p.name for p in ckdir.glob("checkpoint-*.npz"))
    resumed, end_step = run(ckdir, resume=True)
    digests = comm.all_gather_object(resumed)
    if comm.get_rank() == 0:
        print("RESULT " + json.dumps({
            "steps": steps, "stop_step": stop_step, "end_step": end_step, "saved": saved,
            "same_as_straight": resumed == straight, "stopped_differs": stopped != straight,
            "ranks_agree": len(set(digests)) == 1}), flush=True)
    comm.destroy_process_group()


if __name__ == "__main__":
    main()
