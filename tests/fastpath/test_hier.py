"""algorithm="hier" and the Topology on thread ranks: virtual nodes of k ranks
(``MINIDIST_RANKS_PER_NODE``), even and uneven, every dtype and op, results equal to NumPy and
bit-identical across ranks; the byte counters; the topology's numbering.
(Under real mpiexec: tests/fastpath/test_hier_mpi.py.)"""

import numpy as np
import pytest

from minidist.comm.algorithms import ALGORITHMS
from minidist.auto.select import HIER_MIN_BYTES
from minidist.comm.group import ProcessGroup
from minidist.comm.ops import ReduceOp, reference_reduce
from minidist.comm.topology import Topology, detect_topology, ranks_per_node
from minidist.comm.transports.threads import run_threads

from comm.test_algorithms import DTYPES, TOL, world_data


def run_hier(data, op, k, monkeypatch):
    monkeypatch.setenv("MINIDIST_RANKS_PER_NODE", str(k))

    def body(t):
        buf = data[t.rank].copy()
        ALGORITHMS["hier"](t, buf, op)
        return buf, detect_topology(t)

    return run_threads(data.shape[0], body, timeout_s=30)


def check(n, k, count, dtype, op, monkeypatch):
    data = world_data(n, count, dtype, op, seed=n * 10 + k)
    results = run_hier(data, op, k, monkeypatch)
    for r, (res, _) in enumerate(results):
        assert np.array_equal(res.view(np.uint8), results[0][0].view(np.uint8)), \
            f"hier n={n} k={k} count={count} {dtype} {op}: rank {r} differs from rank 0 in bits"
    expected = reference_reduce(list(data), op)
    if np.dtype(dtype).kind == "i":
        np.testing.assert_array_equal(results[0][0], expected)
    else:
        scale = 1.0 if op is not ReduceOp.SUM else float(np.sqrt(n))
        np.testing.assert_allclose(results[0][0].astype(np.float64), expected.astype(np.float64),
                                   rtol=TOL[dtype] * n, atol=TOL[dtype] * scale * 4)
    return results


def test_hier_float16_sum_within_the_summation_bound(monkeypatch):
    """CPU twin of tests/cuda/test_cuda_ipc_gpu.py::test_hier_node_phases_over_cuda_ipc_four_
    ranks: float16, 4 ranks in 2 nodes, the GPU script's inputs. hier sums within a node
    first, so it may differ from the rank-order sum by roundings of partial sums: the check
    is the summation error bound, which still catches a lost contribution."""
    from tolerances import sum_error_bound

    n, count = 4, (1 << 18) + 3
    data = np.stack([(np.random.default_rng(r).standard_normal(count) * 8).astype(np.float16)
                     for r in range(n)])
    got = run_hier(data, ReduceOp.SUM, 2, monkeypatch)[0][0]
    want = reference_reduce(list(data), ReduceOp.SUM)
    bound = sum_error_bound(list(data), np.float16)
    err = np.abs(got.astype(np.float64) - want.astype(np.float64))
    assert np.all(err <= bound), int(np.argmax(err - bound))
    assert bound.max() < 0.25  # tight enough to matter: inputs are ~N(0, 64)
    old = np.abs(want.astype(np.float64)) * 1e-2 + 1e-2  # the rtol = atol = 1e-2 check was
    assert np.count_nonzero(err > old) > 0               # wrong: a few elements fail it
    lost = reference_reduce(list(data[:3]), ReduceOp.SUM).astype(np.float64)  # rank 3 missing
    assert np.mean(np.abs(lost - want) > bound) > 0.9


@pytest.mark.parametrize("n", range(2, 9))
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_hier_float32_sum_every_shape(n, k, monkeypatch):
    for count in sorted({1, n - 1, n, n + 1, 4099, 40000}):  # 40000 x 4 B: ring across nodes
        res = check(n, k, count, "float32", ReduceOp.SUM, monkeypatch)
    topo = res[0][1]
    assert topo.nodes == tuple(tuple(range(i, min(i + k, n))) for i in range(0, n, k))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", list(ReduceOp))
def test_hier_dtypes_and_ops(dtype, op, monkeypatch):
    for n, k in ((4, 2), (5, 2), (7, 3)):  # even nodes, 2+2+1, 3+3+1
        for count in (1, n + 1, 257):
            check(n, k, count, dtype, op, monkeypatch)


def test_hier_inter_node_bytes_once_per_node(monkeypatch):
    n, k, numel = 4, 2, 1 << 16  # 256 KiB float32: the ring across nodes
    monkeypatch.setenv("MINIDIST_RANKS_PER_NODE", str(k))
    data = world_data(n, numel, "float32", ReduceOp.SUM)

    def body(t):
        g = ProcessGroup(t)
        out = {}
        for algo in ("hier", "ring"):
            t.reset_traffic()
            g.all_reduce(data[t.rank].copy(), algorithm=algo)
            out[algo] = t.traffic()
        return out

    res = run_threads(n, body, timeout_s=30)
    size, nodes = data[0].nbytes, n // k
    for r in res:
        assert r["hier"]["inter_node"] == 2 * (nodes - 1) / nodes * size / k
    # the flat ring puts one rank per node on the cross-node link, with k times hier's load
    assert max(r["ring"]["inter_node"] for r in res) == 2 * (n - 1) / n * size
    assert max(r["ring"]["inter_node"] for r in res) > max(r["hier"]["inter_node"] for r in res)


def test_auto_picks_hier_on_several_nodes_only(monkeypatch):
    """On several nodes: rd below HIER_MIN_BYTES (latency-bound), hier from there up."""
    def body(t):
        g = ProcessGroup(t)
        picked = []
        for count in (10, HIER_MIN_BYTES // 4):
            g.all_reduce(np.ones(count, np.float32))
            picked.append((g.ledger.entries()[-1].algorithm, g.ledger.entries()[-1].reason))
        return picked

    monkeypatch.setenv("MINIDIST_RANKS_PER_NODE", "2")
    (small, why_small), (large, why_large) = run_threads(4, body, timeout_s=60)[0]
    assert small == "rd" and "2 nodes" in why_small
    assert large == "hier" and "2 nodes" in why_large
    monkeypatch.delenv("MINIDIST_RANKS_PER_NODE")
    assert all(algo != "hier" for algo, _ in run_threads(4, body, timeout_s=60)[0])


def test_topology_numbering_and_errors(monkeypatch):
    t = Topology(rank=4, node_of=(0, 0, 1, 1, 2))
    assert (t.node_rank, t.local_rank, t.local_world_size, t.num_nodes) == (2, 0, 1, 3)
    assert t.ranks_of_node(1) == (2, 3) and not t.is_single_node()
    with pytest.raises(ValueError, match="there are 3 nodes"):
        t.ranks_of_node(3)
    monkeypatch.setenv("MINIDIST_RANKS_PER_NODE", "zero")
    with pytest.raises(ValueError, match="MINIDIST_RANKS_PER_NODE='zero' is not valid: it "
                                         "accepts a positive whole number"):
        ranks_per_node()
    monkeypatch.setenv("MINIDIST_RANKS_PER_NODE", "")
    assert ranks_per_node() is None
