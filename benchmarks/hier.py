"""Hierarchical all-reduce vs the flat ring over the same network path, on virtual nodes.

    MINIDIST_RANKS_PER_NODE=2 ./mpirun.sh -n 4 python benchmarks/hier.py          # 2 nodes of 2
    MINIDIST_RANKS_PER_NODE=2 ./mpirun.sh -n 4 python benchmarks/hier.py --sizes 64K,1M,16M \
        --repeats 7 --out benchmarks/results

Both algorithms send point-to-point messages through the transport (MPI here), so they take
the same path between virtual nodes. Per size: ``repeats`` rounds, hier and ring interleaved in
each round (the machine is shared: medians of side-by-side samples); a call's time is the
slowest rank's, after a barrier. The transport's byte counters give each rank's inter-node
bytes for one call, printed beside hier's formula 2(N-1)/N x size / k (N nodes, k ranks per
node). Rank 0 prints the table and writes ``hier_n{n}_k{k}.json`` (default: runs/bench/).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from _common import LOCAL_RESULTS, Table, human, machine_info, parse_bytes, shown, write_json

from minidist import comm

ALGOS = ("hier", "ring")


def one_call(group, x: np.ndarray, base: np.ndarray, algo: str) -> tuple[float, int]:
    """(seconds of one all-reduce on the slowest rank, this rank's inter-node bytes in it);
    the input is restored untimed first."""
    x[...] = base
    group.barrier()
    group.transport.reset_traffic()
    t0 = time.perf_counter()
    group.all_reduce(x, algorithm=algo)
    dt = np.array([time.perf_counter() - t0])
    sent = group.transport.traffic()["inter_node"]
    group.all_reduce(dt, op="max", algorithm="ring")
    return float(dt[0]), sent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="64K,1M,16M", help="message sizes, comma-separated")
    p.add_argument("--repeats", type=int, default=7, help="interleaved rounds per size")
    p.add_argument("--iters", type=int, default=3, help="calls per algorithm per round")
    p.add_argument("--out", type=Path, default=str(LOCAL_RESULTS), help="folder for the JSON")
    a = p.parse_args()
    comm.init_process_group()
    g = comm.get_default_group()
    topo, n = g.topology, g.size
    if topo.num_nodes < 2:
        raise SystemExit(f"benchmarks/hier.py: the {n} ranks are on one node; set "
                         "MINIDIST_RANKS_PER_NODE=k (k < n) to split them into virtual nodes.")
    k, N = topo.local_world_size, topo.num_nodes
    even = len({len(x) for x in topo.nodes}) == 1
    rows = []
    table = Table([("size", 9, "s"), ("algo", 5, "s"), ("median_us", 10, ".0f"),
                   ("vs_ring", 7, ".2f"), ("inter_B/rank", 13, "d"), ("max_B/rank", 11, "d"),
                   ("formula_B", 10, "s")])
    if g.rank == 0:
        print(f"# n={n} ranks, nodes {list(topo.nodes)} (virtual: {topo.virtual}), "
              f"transport {g.transport.name}")
        print(table.header())
    for nbytes in (parse_bytes(s) for s in a.sizes.split(",")):
        base = np.random.default_rng(g.rank).normal(size=nbytes // 4).astype(np.float32)
        x = base.copy()
        traffic = {}
        for algo in ALGOS:  # warm up (scratch buffers), and count one call's bytes
            traffic[algo] = g.all_gather_object(one_call(g, x, base, algo)[1])
        times: dict = {algo: [] for algo in ALGOS}
        for _ in range(a.repeats):
            for algo in ALGOS:
                times[algo] += [one_call(g, x, base, algo)[0] for _ in range(a.iters)]
        med = {algo: statistics.median(t) * 1e6 for algo, t in times.items()}
        formula = 2 * (N - 1) / N * x.nbytes / k
        for algo in ALGOS:
            row = {"nbytes": x.nbytes, "algorithm": algo, "median_us": med[algo],
                   "vs_ring": med[algo] / med["ring"], "samples": len(times[algo]),
                   "inter_node_bytes_per_rank": traffic[algo],
                   "mean_inter_node_bytes": sum(traffic[algo]) / n,
                   "formula_bytes": formula if algo == "hier" and even else None}
            rows.append(row)
            if g.rank == 0:
                print(table.row(human(x.nbytes), algo, med[algo], row["vs_ring"],
                                int(row["mean_inter_node_bytes"]), max(traffic[algo]),
                                f"{formula:.0f}" if algo == "hier" and even else "-"))
    if g.rank == 0:
        path = write_json(a.out / f"hier_n{n}_k{k}.json", {
            "benchmark": "hier", "world_size": n, "nodes": [list(x) for x in topo.nodes],
            "virtual": topo.virtual, "transport": g.transport.name,
            "repeats": a.repeats, "iters": a.iters, "rows": rows, "machine": machine_info()})
        print(f"# wrote {shown(path)}")
    comm.destroy_process_group()


if __name__ == "__main__":
    main()
