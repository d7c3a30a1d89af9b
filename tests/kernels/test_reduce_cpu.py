"""The shared-memory all-reduce's one-pass kernel (kernels/reduce_cpu.py) against its NumPy
twin (fastpath/shm.py:sum_pieces): the same bits in every buffer, and an exact NaN/inf verdict
where the twin's dot product may only say "maybe"."""

import numpy as np
import pytest

from minidist.fastpath.shm import sum_pieces
from minidist.kernels import reduce_cpu


def ranks_data(n, size, dtype, seed):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(size) * 10.0 ** rng.integers(-3, 4, size)).astype(dtype)
            for _ in range(n)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [2, 3, 4, 5])
@pytest.mark.parametrize("average", [False, True])
def test_same_bits_as_numpy_in_every_buffer(dtype, n, average):
    divisor = n if average else 1
    data = ranks_data(n, 4099, dtype, seed=n)  # odd: the vector loop's tail runs too
    mine, twin = [a.copy() for a in data], [a.copy() for a in data]
    assert reduce_cpu.sum_to_all(tuple(mine), divisor)
    assert sum_pieces(tuple(twin), divisor)
    want = data[0].copy()
    for a in data[1:]:
        want += a  # rank order
    if average:
        want /= dtype(n)
    for got, other in zip(mine, twin):
        assert got.tobytes() == want.tobytes() == other.tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_one_bad_value_anywhere_is_found(dtype, value):
    for where in (0, 17, 4098):
        data = ranks_data(3, 4099, dtype, seed=where)
        data[1][where] = value
        assert not reduce_cpu.sum_to_all(tuple(data), 3)
        assert all(not np.isfinite(a[where]) for a in data)
        assert all(np.isfinite(np.delete(a, where)).all() for a in data)


def test_two_infinities_that_cancel_are_found():
    a, b = np.ones(100, np.float32), np.ones(100, np.float32)
    a[5], b[5] = np.inf, -np.inf  # inf + -inf = NaN: found in the sum, whatever the inputs
    assert not reduce_cpu.sum_to_all((a, b), 2)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_huge_finite_values_are_finite_here_and_maybe_in_numpy(dtype):
    big = np.finfo(dtype).max / 4
    data = [np.full(1000, big, dtype) for _ in range(2)]
    twin = [a.copy() for a in data]
    assert reduce_cpu.sum_to_all(tuple(data), 2)      # exact: every element is finite
    assert not sum_pieces(tuple(twin), 2)             # the dot product overflows: "maybe"
    assert data[0].tobytes() == twin[0].tobytes()


def test_an_empty_slice_is_finite():
    assert reduce_cpu.sum_to_all((np.empty(0, np.float32), np.empty(0, np.float32)), 2)
