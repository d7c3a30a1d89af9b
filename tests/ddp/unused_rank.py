"""A training loop in which rank 1 skips one layer at one step; run by test_unused_params.py.

    mpiexec -n 2 python tests/ddp/unused_rank.py DIR --skip-at 3 --steps 4 [--overlap]

Rank 1 leaves out the hidden layer ``mid`` at step ``--skip-at`` (the last step by default:
the worst case, where nothing later would notice). Without ``find_unused_parameters`` the
backward of that step must raise on rank 1 and end the job; rank 0 must never get to save
its model (``DIR/model.npz``) nor print ``SAVED``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

import minidist
from minidist import comm, nn, optim
from minidist.ddp import DistributedDataParallel
from minidist.tensor import Tensor


class SkipNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.mid = nn.Linear(16, 16)
        self.out = nn.Linear(16, 3)
        self.skip_mid = False

    def forward(self, x):
        h = self.inp(x).relu()
        if not self.skip_mid:
            h = self.mid(h).relu()
        return self.out(h)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("outdir")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--skip-at", type=int, default=3)
    p.add_argument("--overlap", action="store_true")
    args = p.parse_args()
    comm.init_process_group()
    rank = comm.get_rank()
    minidist.manual_seed(0)
    model = SkipNet()
    # One parameter per bucket: the skipped layer sits in the middle of the launch order.
    ddp = DistributedDataParallel(model, bucket_cap_mb=1e-6, first_bucket_cap_mb=1e-6,
                                  overlap=args.overlap)
    opt = optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()
    rng = np.random.default_rng(rank)
    for step in range(args.steps):
        model.skip_mid = rank == 1 and step == args.skip_at
        x = rng.normal(size=(4, 8)).astype(np.float32)
        y = rng.integers(0, 3, 4)
        loss_fn(ddp(Tensor(x)), y).backward()
        opt.step()
        opt.zero_grad()
    if rank == 0:
        np.savez(Path(args.outdir) / "model.npz", **model.state_dict())
        print("SAVED", flush=True)
    ddp.close()
    comm.destroy_process_group()


if __name__ == "__main__":
    main()
