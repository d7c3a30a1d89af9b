"""algorithm="hier" under mpiexec (rank body); rank 0 prints ``RESULT {...}``.

    MINIDIST_RANKS_PER_NODE=2 ./mpirun.sh -n 4 python tests/fastpath/hier_rank.py 1,2,3 full
    (TCP ranks, torchrun-style: ``hier_rank.py - small`` checks the default group itself)

For every k in the first argument, a group of all ranks is made with
``MINIDIST_RANKS_PER_NODE=k`` (virtual nodes of k consecutive ranks; the last may be smaller)
and checked: its topology; hier equals NumPy and is bit-identical across ranks for every dtype
and op ("full") or float32/int64 sums ("small"); shm refuses a group on several nodes. On the
default group (its k from the environment): the byte counters and DDP with "hier".
"""

from __future__ import annotations

import hashlib
import os
import sys

import numpy as np

import minidist
from minidist import comm
from minidist.comm.errors import CommError
from minidist.comm.ops import ReduceOp, reference_reduce

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "ddp"))
from ddp_rank import close, data, identical_everywhere, train_ddp, train_reference  # noqa: E402

DTYPES = ["float16", "float32", "float64", "int32", "int64"]
TOL = {"float16": 2e-2, "float32": 1e-5, "float64": 1e-12}


def world_data(n: int, count: int, dtype: str, op: ReduceOp, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "i":
        hi = 3 if op is ReduceOp.PROD else 1000
        return rng.integers(-hi, hi, size=(n, count)).astype(dtype)
    if op is ReduceOp.PROD:
        return rng.uniform(0.5, 1.5, size=(n, count)).astype(dtype)
    return rng.normal(size=(n, count)).astype(dtype)


def check_group(g, mode: str) -> dict:
    n, bad, h = g.size, [], hashlib.sha256()
    cases = ([(d, op) for d in DTYPES for op in ReduceOp] if mode == "full"
             else [("float32", ReduceOp.SUM), ("int64", ReduceOp.SUM)])
    for dtype, op in cases:
        for count in (1, n + 1, 257, 20000):  # 20000 x 4 B: the ring between nodes
            w = world_data(n, count, dtype, op, seed=count)
            x = w[g.rank].copy()
            g.all_reduce(x, op=op, algorithm="hier")
            ref = reference_reduce(list(w), op)
            ok = (np.array_equal(x, ref) if x.dtype.kind == "i" else
                  np.allclose(x.astype(np.float64), ref.astype(np.float64), rtol=TOL[dtype] * n,
                              atol=TOL[dtype] * 4 * (np.sqrt(n) if op is ReduceOp.SUM else 1)))
            if not ok:
                bad.append(f"{dtype}/{op.value}/{count}")
            h.update(x.tobytes())
    topo = g.topology
    try:
        g.all_reduce(np.ones(4, np.float32), algorithm="shm")
        shm_error = ""
    except (CommError, ValueError) as e:
        shm_error = str(e)
    return {"bad": bad, "identical": len(set(g.all_gather_object(h.hexdigest()))) == 1,
            "nodes": [list(x) for x in topo.nodes], "local_rank": topo.local_rank,
            "node_rank": topo.node_rank, "shm_error": shm_error, "has_shm": g.shared_memory is not None}


def main() -> None:
    ks, mode = [int(k) for k in sys.argv[1].split(",") if k != "-"], sys.argv[2]
    comm.init_process_group()
    world = comm.get_default_group()
    rank, n = world.rank, world.size
    res: dict = {"n": n, "groups": {}}
    default_k = os.environ.get("MINIDIST_RANKS_PER_NODE")
    for k in ks:
        os.environ["MINIDIST_RANKS_PER_NODE"] = str(k)
        g = minidist.new_group(list(range(n)))  # a new transport: finds its topology again
        rows = g.all_gather_object(check_group(g, mode))
        res["groups"][str(k)] = rows
    if not ks:  # the default group itself (TCP: no sub-groups)
        res["groups"][default_k] = world.all_gather_object(check_group(world, mode))
    if default_k is None:
        os.environ.pop("MINIDIST_RANKS_PER_NODE", None)
    else:
        os.environ["MINIDIST_RANKS_PER_NODE"] = default_k
    # bytes between nodes on the default group: hier vs the flat ring, 64 KiB float32 x n
    size = 16384 * n * 4
    x = np.ones(size // 4, np.float32)
    traffic = {}
    for algo in ("hier", "ring"):
        world.transport.reset_traffic()
        world.all_reduce(x, algorithm=algo)
        traffic[algo] = world.transport.traffic()
    res["traffic"] = world.all_gather_object(traffic)
    res["size"] = size
    res["num_nodes"] = world.topology.num_nodes
    # DDP with hier (and auto, which is hier on several nodes) = one process on the global batch
    xs, ys = data(2, 1, n)
    ref = train_reference("sgd", xs, ys)
    for algo in ("hier", "auto"):
        m = train_ddp("sgd", xs, ys, rank, algorithm=algo)
        res[f"ddp/{algo}"] = {"close": close(m, ref), "identical": identical_everywhere(m)}
    if rank == 0:
        import json
        print("RESULT " + json.dumps(res), flush=True)
    comm.destroy_process_group()


if __name__ == "__main__":
    main()
