"""A short Trainer run with the step timeline on; run by tests/ddp/test_trace_mpi.py.

    MINIDIST_TRACE=DIR mpiexec -n 2 python tests/ddp/trace_rank.py [--overlap]

One parameter per bucket (4 buckets), 3 optimizer steps per rank; rank 0 prints
``RESULT {"buckets": 4, "steps": 3, ...}`` for the test to compare with the trace files.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

import minidist
from minidist import comm, nn, optim
from minidist.data import ArrayDataset
from minidist.trainer import Trainer, TrainerConfig


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--overlap", action="store_true")
    args = p.parse_args()
    comm.init_process_group()
    world = comm.get_world_size()
    minidist.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(24 * world, 8)).astype(np.float32)
    data = ArrayDataset(x, (x[:, 0] > 0).astype(np.int64))
    cfg = TrainerConfig(epochs=1, batch_size=8, verbose=False,
                        ddp_options={"bucket_cap_mb": 1e-6, "first_bucket_cap_mb": 1e-6,
                                     "overlap": args.overlap})
    trainer = Trainer(model, nn.CrossEntropyLoss(), optim.SGD(model.parameters(), lr=0.1), cfg)
    trainer.fit(data)
    if comm.get_rank() == 0:
        print("RESULT " + json.dumps({"buckets": len(trainer.ddp.buckets),
                                      "steps": trainer.global_step, "world_size": world}),
              flush=True)
    trainer.ddp.close()
    comm.destroy_process_group()


if __name__ == "__main__":
    main()
