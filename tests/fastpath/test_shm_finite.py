"""``finite_fast``: the NaN/inf verdict the shared-memory all-reduce takes of each piece."""

import warnings

import numpy as np
import pytest

from minidist.fastpath.shm import finite_fast


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_finite_fast_finds_nan_and_inf_and_overflows_quietly(dtype):
    x = np.random.default_rng(0).normal(size=4096).astype(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a "maybe" from an overflow is not a RuntimeWarning
        assert finite_fast(x)
        for bad in (np.nan, np.inf, -np.inf):
            y = x.copy()
            y[1001] = bad
            assert not finite_fast(y)
        assert not finite_fast(np.full(4096, np.finfo(dtype).max / 2, dtype))  # "maybe"
    assert finite_fast(np.arange(5))  # integers are always finite
