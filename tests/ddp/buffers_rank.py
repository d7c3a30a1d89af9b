"""broadcast_buffers under mpiexec (rank body); rank 0 prints ``RESULT {...}``.

    ./mpirun.sh -n 2 python tests/ddp/buffers_rank.py    # tests/ddp/test_buffers_mpi.py

A Linear + BatchNorm1d model trains a few steps on different data per rank, each step with a
no_sync micro-batch and an eval forward under no_grad beside the synced one. torch's rule
(``require_forward_param_sync``): a forward broadcasts rank 0's buffers when the forward
before it was a synced one in grad mode, so each eval forward here starts from rank 0's
statistics, and the ranks end with identical running statistics exactly with
broadcast_buffers=True; with False the different batches leave them apart.

``eval_after_training``: a plain-BatchNorm model trained on different data per rank, then
evaluated under no_grad on the same input: the first eval forward broadcasts rank 0's
statistics (one message per dtype), so every rank computes the same output; the second sends
nothing. ``pattern``: which forwards of a fixed sequence broadcast, for comparison with the
rule written out in the test.
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
        with minidist.no_grad():                      # eval forward: broadcasts (torch's rule)
            ddp.eval()
            ddp(minidist.tensor(data[rank, step, 1]))
            ddp.train()
    bn = model[1]
    stats = np.concatenate([bn.running_mean.array, bn.running_var.array,
                            bn.num_batches_tracked.array.reshape(1).astype(np.float32)])
    gathered = comm.all_gather_object(stats.tolist())
    ddp.close()
    return {"identical": all(g == gathered[0] for g in gathered),
            "tracked": int(bn.num_batches_tracked.array)}


def broadcasts() -> int:
    return sum(e.collective == "broadcast" for e in comm.get_ledger())


def eval_after_training() -> dict:
    rank = comm.get_rank()
    minidist.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    ddp = DistributedDataParallel(model)
    opt = SGD(ddp.parameters(), lr=0.1)
    rng = np.random.default_rng(2)
    for _ in range(3):
        x = rng.normal(size=(comm.get_world_size(), 8, 4)).astype(np.float32)
        ddp(minidist.tensor(x[rank] * (1 + rank))).sum().backward()
        opt.step()
        opt.zero_grad()
    stats = comm.all_gather_object(model[1].running_mean.array.tolist())
    ddp.eval()
    probe = minidist.tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4))
    sent = [broadcasts()]
    with minidist.no_grad():
        first = ddp(probe).numpy().tolist()
        sent.append(broadcasts())
        ddp(probe)
        sent.append(broadcasts())
    outs = comm.all_gather_object(first)
    ddp.close()
    return {"stats_differed_after_training": any(s != stats[0] for s in stats),
            "eval_outputs_identical": all(o == outs[0] for o in outs),
            "first_eval_broadcasts": sent[1] - sent[0], "second_eval_broadcasts": sent[2] - sent[1]}


def pattern() -> list:
    """1 where a forward broadcast the buffers: synced, no_sync, no_grad, no_grad, synced,
    synced, no_grad (each forward in grad mode followed by its backward)."""
    minidist.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    ddp = DistributedDataParallel(model)
    x = minidist.tensor(np.ones((4, 4), np.float32) * (1 + comm.get_rank()))
    out = []
    for kind in ["synced", "no_sync", "no_grad", "no_grad", "synced", "synced", "no_grad"]:
        before = broadcasts()
        if kind == "synced":
            ddp(x).sum().backward()
        elif kind == "no_sync":
            with ddp.no_sync():
                ddp(x).sum().backward()
        else:
            with minidist.no_grad():
                ddp(x)
        out.append(int(broadcasts() > before))
    ddp.close()
    return out


def main() -> None:
    comm.init_process_group()
    result = {"world_size": comm.get_world_size(), "on": run(True), "off": run(False),
              "eval": eval_after_training(), "pattern": pattern()}
    if comm.get_rank() == 0:
        print("RESULT " + json.dumps(result), flush=True)
    comm.destroy_process_group()


if __name__ == "__main__":
    main()
