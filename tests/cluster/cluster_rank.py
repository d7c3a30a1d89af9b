"""Rank body for tests/cluster/: run on 2 namespace nodes x k ranks (TCP launcher or mpiexec).

    python -m minidist.testing.cluster --nodes 2 -- tests/cluster/cluster_rank.py
    python -m minidist.testing.cluster --nodes 2 --mpi -- python tests/cluster/cluster_rank.py

Checks, on the default group spanning real nodes (one host name per node): the topology;
all_reduce with ``hier``, ``auto``, ``ring`` and ``rd`` over every dtype and op at counts that
take the inter-node path (equal to NumPy, bit-identical across ranks); shm refused across
nodes; DDP with ``hier`` and ``auto`` equal to one process training on the global batch.
Rank 0 prints ``RESULT {json}``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

import numpy as np

from minidist import comm
from minidist.comm.ops import ReduceOp, reference_reduce

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "ddp"))
sys.path.insert(0, os.path.join(HERE, "..", "fastpath"))
from ddp_rank import close, data, identical_everywhere, train_ddp, train_reference  # noqa: E402
from hier_rank import DTYPES, TOL, world_data  # noqa: E402

ALGORITHMS = ("hier", "auto", "ring", "rd")


def fuzz(g) -> list[str]:
    """Every algorithm x dtype x op x count against NumPy; the failures, named."""
    n, bad = g.size, []
    for dtype in DTYPES:
        for op in ReduceOp:
            for count in (1, n + 1, 257, 20000):
                w = world_data(n, count, dtype, op, seed=count)
                ref = reference_reduce(list(w), op)
                for algo in ALGORITHMS:
                    x = w[g.rank].copy()
                    g.all_reduce(x, op=op, algorithm=algo)
                    ok = (np.array_equal(x, ref) if x.dtype.kind == "i" else np.allclose(
                        x.astype(np.float64), ref.astype(np.float64), rtol=TOL[dtype] * n,
                        atol=TOL[dtype] * 4 * (np.sqrt(n) if op is ReduceOp.SUM else 1)))
                    digest = hashlib.sha256(x.tobytes()).hexdigest()
                    same = len(set(g.all_gather_object(digest))) == 1
                    if not ok or not same:
                        bad.append(f"{algo}/{dtype}/{op.value}/{count}"
                                   f"{'' if same else ' (ranks differ)'}")
    return bad


def main() -> None:
    g = comm.init_process_group()
    rank, n = g.rank, g.size
    topo = g.topology
    res: dict = {"n": n, "backend": g.backend, "nodes": [list(x) for x in topo.nodes],
                 "virtual": topo.virtual, "bad": fuzz(g)}
    try:
        g.all_reduce(np.ones(4, np.float32), algorithm="shm")
        res["shm_error"] = ""
    except (comm.CommError, ValueError) as e:
        res["shm_error"] = str(e)
    res["auto_choice_1M"] = g.auto_choice(np.ones(1 << 18, np.float32))[0]
    xs, ys = data(3, 1, n)
    ref = train_reference("sgd", xs, ys)
    for algo in ("hier", "auto"):
        m = train_ddp("sgd", xs, ys, rank, algorithm=algo)
        res[f"ddp/{algo}"] = {"close": close(m, ref), "identical": identical_everywhere(m)}
    if rank == 0:
        print("RESULT " + json.dumps(res), flush=True)
    comm.destroy_process_group()


if __name__ == "__main__":
    main()
