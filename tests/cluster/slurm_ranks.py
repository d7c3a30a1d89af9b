"""Rank body for tests/cluster/test_slurm.py: one srun task per rank on the SLURM nodes.

    srun --nodes=2 --ntasks-per-node=2 --mpi=pmi2 python tests/cluster/slurm_ranks.py

Each rank prints ``RANK {json}``: its rank, ``get_local_rank()``, the launcher it was detected
under, its host name, the topology's nodes and local rank, and whether a ``hier`` all-reduce
(intra-node groups, then across the nodes) summed right.
"""

from __future__ import annotations

import json
import socket

import numpy as np

from minidist import comm


def main() -> None:
    g = comm.init_process_group()
    x = np.full(1 << 16, g.rank + 1, np.float32)
    g.all_reduce(x, algorithm="hier")
    expected = g.size * (g.size + 1) / 2
    print("RANK " + json.dumps({
        "rank": g.rank, "size": g.size, "backend": g.backend, "local_rank": comm.get_local_rank(),
        "host": socket.gethostname(), "nodes": [list(n) for n in g.topology.nodes],
        "topology_local_rank": g.topology.local_rank, "virtual": g.topology.virtual,
        "hier_ok": bool(np.all(x == expected))}), flush=True)
    comm.destroy_process_group()


if __name__ == "__main__":
    main()
