"""A Trainer run that one rank breaks, for ``python -m minidist.launch --max-restarts``.

    python -m minidist.launch --standalone --nproc-per-node 2 --max-restarts 1 \\
        tests/launch/restart_rank.py DIR once

``once``: on the first attempt (TORCHELASTIC_RESTART_COUNT=0) rank 1 raises after epoch 2's
checkpoint; the restarted group resumes from it. ``always``: rank 1 raises on every attempt.
``never``: no failure. Rank 0 ends with ``RESULT <digest of the model> start_epoch <e>``.
"""

import hashlib
import os
import sys

import numpy as np

import minidist
from minidist import nn, optim
from minidist.data import ArrayDataset
from minidist.trainer import Trainer, TrainerConfig


def main(ckdir, mode):
    minidist.init_process_group()
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    fail = mode == "always" or (mode == "once" and attempt == 0)
    minidist.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    rng = np.random.default_rng(1)
    x = rng.normal(size=(96, 8)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 1).astype(np.int64)
    cfg = TrainerConfig(epochs=4, batch_size=8, seed=3, checkpoint_dir=ckdir,
                        checkpoint_every_n_epochs=1, resume="if_present",
                        stop_after_epochs=2 if fail else None, verbose=False)
    trainer = Trainer(model, nn.CrossEntropyLoss(), optim.AdamW(model.parameters(), lr=0.01),
                      cfg)
    trainer.fit(ArrayDataset(x, y))
    if fail and minidist.get_rank() == 1:
        raise RuntimeError(f"injected failure on attempt {attempt}, after epoch 2")
    trainer.ddp.close()
    digest = hashlib.sha256(b"".join(np.ascontiguousarray(a).tobytes()
                                     for a in model.state_dict().values())).hexdigest()
    if minidist.get_rank() == 0:
        print(f"RESULT {digest} start_epoch {trainer.start_epoch} attempt {attempt}", flush=True)
    minidist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
