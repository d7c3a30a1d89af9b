"""Every all-reduce algorithm x world size 1..8 x awkward counts x dtypes x ops, on thread ranks.

Each rank slices its input from one world array (seeded identically), so every rank can compute
the expected result locally; results are compared with NumPy (tolerance per dtype), with the
`direct` oracle, and bit for bit across ranks.
"""

import numpy as np
import pytest

from minidist.comm.algorithms import ALGORITHMS
from minidist.comm.ops import ReduceOp, reference_reduce
from minidist.comm.transports.threads import run_threads

OURS = ["direct", "ring", "tree", "rd"]
DTYPES = ["float16", "float32", "float64", "int32", "int64"]
TOL = {"float16": 2e-2, "float32": 1e-5, "float64": 1e-12}


def world_data(n, count, dtype, op, seed=0):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "i":
        hi = 3 if op is ReduceOp.PROD else 1000
        return rng.integers(-hi, hi, size=(n, count)).astype(dtype)
    if op is ReduceOp.PROD:  # keep products of 8 values well inside float16 range
        return rng.uniform(0.5, 1.5, size=(n, count)).astype(dtype)
    return rng.normal(size=(n, count)).astype(dtype)


def run_algorithm(name, data, op):
    n = data.shape[0]

    def body(t):
        buf = data[t.rank].copy()
        ALGORITHMS[name](t, buf, op)
        return buf

    return run_threads(n, body, timeout_s=30)


def check(name, n, count, dtype, op):
    data = world_data(n, count, dtype, op)
    results = run_algorithm(name, data, op)
    for r, res in enumerate(results):
        assert res.dtype == np.dtype(dtype) and res.shape == (count,)
        assert np.array_equal(res.view(np.uint8), results[0].view(np.uint8)), \
            f"{name} n={n} count={count} {dtype} {op}: rank {r} differs from rank 0 in bits"
    expected = reference_reduce(list(data), op)
    if np.dtype(dtype).kind == "i":
        np.testing.assert_array_equal(results[0], expected)
    else:
        scale = 1.0 if op is not ReduceOp.SUM else float(np.sqrt(n))
        np.testing.assert_allclose(results[0].astype(np.float64), expected.astype(np.float64),
                                   rtol=TOL[dtype] * n, atol=TOL[dtype] * scale * 4)
    return results[0]


@pytest.mark.parametrize("name", OURS)
@pytest.mark.parametrize("n", range(1, 9))
def test_counts_float32_sum(name, n):
    for count in sorted({0, 1, max(n - 1, 0), n, n + 1, 4099}):
        check(name, n, count, "float32", ReduceOp.SUM)


@pytest.mark.parametrize("name", OURS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", list(ReduceOp))
def test_dtypes_and_ops(name, dtype, op):
    for n in (3, 4):  # a non-power-of-two and a power-of-two world
        for count in (1, n + 1, 257):
            check(name, n, count, dtype, op)


@pytest.mark.parametrize("name", OURS)
@pytest.mark.parametrize("n", [2, 5, 8])
def test_large_prime_count(name, n):
    # 65537 float32 = 256 KiB: the Rabenseifner branch of rd, uneven ring chunks
    check(name, n, 65537, "float32", ReduceOp.SUM)


@pytest.mark.parametrize("name", ["ring", "tree", "rd"])
@pytest.mark.parametrize("n", [3, 6, 7])
def test_matches_direct_oracle_int64(name, n):
    # integer sums are exact, so every algorithm must equal the oracle exactly
    data = world_data(n, 4099, "int64", ReduceOp.SUM, seed=n)
    ours = run_algorithm(name, data, ReduceOp.SUM)[0]
    oracle = run_algorithm("direct", data, ReduceOp.SUM)[0]
    np.testing.assert_array_equal(ours, oracle)


def test_avg_on_integers_floors():
    data = np.array([[1, -1, 7], [2, -2, 0]], dtype=np.int32)
    for name in OURS:
        res = run_algorithm(name, data, ReduceOp.AVG)[0]
        np.testing.assert_array_equal(res, [1, -2, 3])  # floor((1+2)/2), floor(-3/2), floor(7/2)


def test_mpi_algorithm_refuses_non_mpi_transport():
    def body(t):
        ALGORITHMS["mpi"](t, np.ones(4, np.float32), ReduceOp.SUM)

    with pytest.raises(RuntimeError, match="rank 0 raised ValueError.*algorithm=\"mpi\""):
        run_threads(2, body, timeout_s=10)
