"""new_group, async collectives and Tensors on 4 ranks (rank body); rank 0 prints ``RESULT {...}``.

    ./mpirun.sh -n 4 python tests/comm/subgroup_rank.py     # tests/comm/test_subgroups_mpi.py
    # or 4 TCP ranks started torchrun-style (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)

Two sub-groups of 2 ranks, {0, 1} and {2, 3}: collectives inside each see only its members;
a DDP model over each sub-group ends identical inside the group and different across groups
(different data); async_op=True returns a Work that completes; a Tensor goes where an array
does; world collectives in between never mix with the sub-groups' messages.
"""

from __future__ import annotations

import json

import numpy as np

import minidist
from minidist import comm, nn
from minidist.ddp import DistributedDataParallel
from minidist.optim import SGD


def main() -> None:
    comm.init_process_group()
    rank, world = comm.get_rank(), comm.get_world_size()
    low = minidist.new_group([0, 1])                  # every rank calls both, in order
    high = minidist.new_group([3, 2])                 # order given: world 3 is group rank 0
    mine = low if rank < 2 else high
    other = high if rank < 2 else low
    res: dict = {"world_size": world, "other_is_none": other is None}
    x = np.array([float(rank + 1)])
    work = minidist.all_reduce(x, group=mine, async_op=True)
    res["waited"] = work.wait(timeout=5.0) and work.is_completed()
    res["sum"] = float(x[0])                          # 1+2=3 on {0,1}, 3+4=7 on {2,3}
    y = np.array([float(rank + 1)])
    queued = [minidist.all_reduce(y, group=mine, async_op=True) for _ in range(3)]
    w_sum = np.array([1.0])
    minidist.all_reduce(w_sum)                        # world, synchronous, between them
    z = np.array([float(rank)])
    minidist.all_reduce(z, group=mine)                # synchronous: after the queued ones
    res["queued"] = [q.wait() for q in queued] == [True] * 3 and float(y[0])
    res["world_sum"], res["z"] = float(w_sum[0]), float(z[0])
    res["group_rank"] = mine.rank
    t = minidist.tensor(np.full(2, float(rank), np.float32))
    w = minidist.broadcast(t, src=0, group=mine, async_op=True)
    w.wait()
    res["bcast"] = float(t.array[0])                   # group rank 0: world 0, world 3
    gathered = np.zeros(2 * mine.size)
    minidist.all_gather_into(gathered, np.full(2, float(rank)), group=mine, async_op=True).wait()
    res["gathered"] = gathered.tolist()
    chunk = np.zeros(1)
    minidist.reduce_scatter(chunk, np.arange(2.0) + rank, group=mine, async_op=True).wait()
    res["scattered"] = float(chunk[0])
    try:
        work.wait(timeout=-1)
    except ValueError as e:
        res["negative_timeout"] = str(e)
    minidist.manual_seed(0)
    model = nn.Linear(3, 2)
    ddp = DistributedDataParallel(model, process_group=mine)
    opt = SGD(ddp.parameters(), lr=0.1)
    rng = np.random.default_rng(rank)
    for _ in range(3):
        ddp(minidist.tensor(rng.normal(size=(4, 3)).astype(np.float32))).sum().backward()
        opt.step()
        opt.zero_grad()
    ddp.close()
    weights = comm.all_gather_object(model.weight.array.ravel().tolist())
    res["ddp_same_in_group"] = weights[0] == weights[1] and weights[2] == weights[3]
    res["ddp_differs_across"] = weights[0] != weights[2]
    rows = comm.all_gather_object(res)
    if rank == 0:
        print("RESULT " + json.dumps(rows), flush=True)
    comm.destroy_process_group()


if __name__ == "__main__":
    main()
