"""Pre-flight checks on every rank under mpiexec; rank 0 prints one JSON line ``RESULT {...}``.

    ./mpirun.sh -n 2 python tests/ddp/preflight_rank.py   # tests/ddp/test_preflight_mpi.py

Each case makes the LAST rank differ in one way, runs the check, and records on every rank
the error it got (caught here, so the next case can run) and whether a training step ran:

1. a different model (one layer wider)               -> DistributedDataParallel raises
2. a different dataset, so a different batch count   -> Trainer.fit raises before step 0
3. a different minidist version (MINIDIST_FAKE_VERSION on that rank only, as the variable
   is meant for tests)                                -> DistributedDataParallel raises
4. the same everything                                -> no error (the check costs nothing more)
"""

from __future__ import annotations

import json
import os
import sys
import traceback

import numpy as np

import minidist
from minidist import comm, nn, optim
from minidist.data import ArrayDataset
from minidist.ddp import DistributedDataParallel, PreflightError
from minidist.trainer import Trainer, TrainerConfig


def build(hidden: int = 16):
    minidist.manual_seed(0)
    return nn.Sequential(nn.Linear(8, hidden), nn.ReLU(), nn.Linear(hidden, 3))


def dataset(n: int):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(n, 8)).astype(np.float32)
    return ArrayDataset(x, (x[:, 0] > 0).astype(np.int64))


class CountingLoss(nn.CrossEntropyLoss):
    calls = 0

    def forward(self, logits, target):
        CountingLoss.calls += 1
        return super().forward(logits, target)


def error_of(fn) -> str:
    try:
        fn()
    except PreflightError as e:
        return str(e)
    return ""


def main() -> None:
    comm.init_process_group()
    rank, world = comm.get_rank(), comm.get_world_size()
    odd = rank == world - 1
    res: dict = {"world_size": world}

    def ddp_of(model):
        ddp = DistributedDataParallel(model)
        ddp.close()

    res["model"] = comm.all_gather_object(error_of(lambda: ddp_of(build(17 if odd else 16))))

    def fit(n):
        model = build()
        t = Trainer(model, CountingLoss(), optim.SGD(model.parameters(), lr=0.1),
                    TrainerConfig(epochs=1, batch_size=8, verbose=False))
        try:
            t.fit(dataset(n))
        finally:
            t.ddp.close()
    res["batches"] = comm.all_gather_object(error_of(lambda: fit(203 + (60 if odd else 0))))
    res["steps_run"] = comm.all_gather_object(CountingLoss.calls)

    if odd:
        os.environ["MINIDIST_FAKE_VERSION"] = "9.9.9"
    res["version"] = comm.all_gather_object(error_of(lambda: ddp_of(build())))
    os.environ.pop("MINIDIST_FAKE_VERSION", None)

    res["same"] = comm.all_gather_object(error_of(lambda: fit(203)))
    if rank == 0:
        print("RESULT " + json.dumps(res), flush=True)
    comm.barrier()
    comm.destroy_process_group()


if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
        sys.stdout.flush()
        raise
