"""algorithm="hier" and virtual nodes under real mpiexec (rank body: tests/fastpath/hier_rank.py):
equal to NumPy and bit-identical across ranks for n = 2..8 and 1..4 ranks per virtual node
(even and uneven nodes), every dtype and op at n=5 (2+2+1); inter-node bytes per rank =
2(N-1)/N x size / k; DDP with hier. (Every shape on thread ranks: tests/fastpath/test_hier.py.)
"""

import json

import pytest

from procs import run_env_ranks, run_mpi


def expected_nodes(n, k):
    return [list(range(i, min(i + k, n))) for i in range(0, n, k)]


def run(n, ks, mode, default_k, tcp=False):
    args = ["tests/fastpath/hier_rank.py", ",".join(map(str, ks)) or "-", mode]
    env = {"MINIDIST_RANKS_PER_NODE": str(default_k), "MINIDIST_TIMEOUT_S": "30"}
    job = (run_env_ranks(n, args, timeout_s=120, env=env) if tcp else
           run_mpi(n, args, timeout_s=120, env=env))
    assert job.returncode == 0, job.report()
    return json.loads(next(line for line in job.stdout.splitlines()
                           if line.startswith("RESULT "))[len("RESULT "):])


@pytest.mark.mpi
@pytest.mark.parametrize("n, ks, mode, default_k", [
    (2, [1, 2], "small", 1),
    (3, [1, 2], "small", 2),
    (4, [1, 2, 3, 4], "small", 2),
    (5, [2], "full", 2),            # uneven nodes 2+2+1, every dtype and op
    (8, [3, 4], "small", 4),
])
def test_hier_under_mpiexec(n, ks, mode, default_k, tcp=False):
    res = run(n, ks, mode, default_k, tcp)
    for k in ks or [default_k]:
        rows = res["groups"][str(k)]
        nodes = expected_nodes(n, k)
        for r, row in enumerate(rows):
            assert row["bad"] == [], (n, k, r, row["bad"])
            assert row["identical"], (n, k)
            assert row["nodes"] == nodes
            node = r // k
            assert (row["node_rank"], row["local_rank"]) == (node, r - node * k)
            if len(nodes) > 1:  # shared memory only within one node
                assert not row["has_shm"] and "virtual nodes" in row["shm_error"], row
    # inter-node bytes: hier sends 2(N-1)/N x size / k from EVERY rank when nodes are even
    size, nodes = res["size"], expected_nodes(n, default_k)
    N = len(nodes)
    hier = [t["hier"]["inter_node"] for t in res["traffic"]]
    ring = [t["ring"]["inter_node"] for t in res["traffic"]]
    if N > 1 and n % default_k == 0:
        assert hier == [2 * (N - 1) / N * size / default_k] * n, hier
        assert max(ring) == 2 * (n - 1) / n * size  # the rank whose ring neighbour is remote
        assert default_k == 1 or max(ring) > max(hier)
    for algo in ("hier", "auto"):
        assert res[f"ddp/{algo}"] == {"close": True, "identical": True}, res[f"ddp/{algo}"]


def test_hier_over_tcp_ranks():
    """The TCP transport: nodes from host names exchanged at start-up, then split virtually."""
    test_hier_under_mpiexec(4, [], "small", 2, tcp=True)


@pytest.mark.mpi
def test_hier_benchmark_counts_the_formula(tmp_path):
    job = run_mpi(4, ["benchmarks/hier.py", "--sizes", "64K", "--repeats", "1", "--iters", "1",
                      "--out", tmp_path], timeout_s=120, env={"MINIDIST_RANKS_PER_NODE": "2"})
    assert job.returncode == 0, job.report()
    out = json.loads((tmp_path / "hier_n4_k2.json").read_text())
    rows = {r["algorithm"]: r for r in out["rows"]}
    assert rows["hier"]["inter_node_bytes_per_rank"] == [rows["hier"]["formula_bytes"]] * 4
    assert max(rows["ring"]["inter_node_bytes_per_rank"]) == 3 * rows["hier"]["formula_bytes"]
