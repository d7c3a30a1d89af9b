"""broadcast_buffers under mpiexec (rank body); rank 0 prints ``RESULT {...}``.

    ./mpirun.sh -n 2 python tests/ddp/buffers_rank_script.py    # tests/ddp/test_buffers_mpi.py

A Linear + BatchNorm1d model trains a few steps on different data per rank, each step with a
no_sync micro-batch and an eval forward under no_grad beside the synced one. The last synced
forward sees the same batch on every rank (each rank updates the statistics it starts from
with its own batch, as in torch), so the ranks end with identical running statistics exactly
when that forward started from the same (rank 0's) buffers: with broadcast_buffers=True;
with False the earlier, different batches leave them apart.
"""

from __future__ import annotations

import json

import numpy as np

import minidist
from minidist import comm, nn
from minidist.ddp import DistributedDataParallel
from minidist.optim import SGD


def run(broadcast_buffers: bool) -> dict:
    rank, world = comm.get_rank(), comm.get_world_size()
    minidist.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    ddp = DistributedDataParallel(model, broadcast_buffers=broadcast_buffers)
    opt = SGD(ddp.parameters(), lr=0.1)
    rng = np.random.default_rng(1)
    scale = (1 + np.arange(world, dtype=np.float32))[:, None, None, None, None]
    data = rng.normal(size=(world, 4, 2, 8, 4)).astype(np.float32) * scale  # float32 model
    for step in range(4):
        with ddp.no_sync():                           # micro-batch: no buffer broadcast
            ddp(minidist.tensor(data[rank, step, 0])).sum().backward()
        last = step == 3                              # the same batch everywhere (see above)
        out = ddp(minidist.tensor(data[0 if last else rank, step, 1]))  # broadcasts buffers
        out.sum().backward()
        opt.step()
        opt.zero_grad()
        with minidist.no_grad():                      # eval forward: no collective
            ddp.eval()
            ddp(minidist.tensor(data[rank, step, 1]))
            ddp.train()
    bn = model[1]
    stats = np.concatenate([bn.running_mean.data, bn.running_var.data,
                            bn.num_batches_tracked.data.reshape(1).astype(np.float32)])
    gathered = comm.all_gather_object(stats.tolist())
    ddp.close()
    return {"identical": all(g == gathered[0] for g in gathered),
            "tracked": int(bn.num_batches_tracked.data)}


def main() -> None:
    comm.init_process_group()
    result = {"world_size": comm.get_world_size(), "on": run(True), "off": run(False)}
    if comm.get_rank() == 0:
        print("RESULT " + json.dumps(result), flush=True)
    comm.destroy_process_group()


if __name__ == "__main__":
    main()
