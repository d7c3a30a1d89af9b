"""The CUDA kernels under Numba's simulator, against the NumPy reference: bit for bit.

Run by test_kernels_cudasim.py in its own process, with NUMBA_ENABLE_CUDASIM=1 set before numba
is imported (the simulator and the real CUDA target cannot share a process). Simulated threads
are Python threads (~2 us per element-iteration, ~0.2 ms per thread per launch), so arrays stay
at n <= 4096 and grids at <= 2 x 64 threads, with n not a multiple of the grid: the grid-stride
loop's ragged tail runs in every launch.
"""

import numpy as np
import pytest

from minidist.kernels import cuda as kcuda
from minidist.kernels import reference as ref

# NumPy scalar arithmetic in the simulated kernels warns where the device silently gives inf
# (overflow) or NaN (a signaling NaN input): expected results here, not problems
pytestmark = [pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]

GRIDS = [(1, 32), (2, 64)]


def test_running_in_the_simulator():
    from numba import config

    assert config.ENABLE_CUDASIM and kcuda.SIMULATOR
    with pytest.raises(RuntimeError, match="simulator"):
        kcuda.check_usable()


def specials(dtype):
    v = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 65504.0, 65520.0, 1e30,
                  2.0 ** -24, 2.0 ** -149, 3e38, -7.5], np.float32)
    return v.astype(dtype) if dtype == np.float16 else v


def fp16_patterns(count=4096, seed=0):
    """Every fp16 pattern with exponent 0 (subnormals) or 31 (inf/NaN), plus random others."""
    allh = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    exp = allh & 0x7C00
    edge = allh[(exp == 0) | (exp == 0x7C00)][::2]  # 2048 of the 4096 edge patterns
    rest = np.random.default_rng(seed).choice(allh[(exp != 0) & (exp != 0x7C00)],
                                              count - edge.size, replace=False)
    return np.concatenate([edge, rest]).view(np.float16)


def run_both(src, inv, in_place, grid):
    got_src, want_src = src.copy(), src.copy()
    got = got_src if in_place else np.full(src.size, 7.0, np.float32)
    want = want_src if in_place else np.full(src.size, 7.0, np.float32)
    with np.errstate(all="ignore"):
        found = kcuda.unscale_and_check(got_src, got, inv, launch=grid)
        want_found = ref.unscale_and_check(want_src, want, inv)
    assert found is want_found
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("inv", [1.0, 2.0 ** -16, 1 / 3])
def test_fp16_to_master_bit_exact(grid, inv):
    run_both(fp16_patterns(), inv, in_place=False, grid=grid)


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("in_place", [True, False])
def test_fp32_bit_exact(grid, in_place):
    rng = np.random.default_rng(1)
    src = np.concatenate([specials(np.float32), rng.standard_normal(1000).astype(np.float32),
                          rng.integers(0, 1 << 32, 1000, dtype=np.uint64).astype(np.uint32)
                          .view(np.float32)])
    run_both(src, 1 / 3, in_place, grid)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("n", [0, 1, 127, 129, 1001])
def test_lengths_and_positions(dtype, n):
    """Bad values at 0, n-1 and around the stride (128 threads) are found; clean is clean."""
    for positions in ([], [0], [n - 1], [127], [128], [n // 2]):
        src = np.linspace(-5, 5, n).astype(dtype)
        for p in positions:
            if 0 <= p < n:
                src[p] = np.nan
        run_both(src, 0.5, in_place=False, grid=(2, 64))


def test_device_inv_scale_and_found_inf_contract():
    from numba import cuda

    src = np.array([1.0, 2.0, np.inf, 4.0] * 50, np.float16)
    dst = np.empty(src.size, np.float32)
    found = np.zeros(1, np.float32)
    kcuda.unscale_and_check_(src, dst, cuda.to_device(np.array([0.5], np.float32)), found,
                             launch=(2, 64))
    assert found[0] == 1.0 and dst[:4].tolist() == [0.5, 1.0, np.inf, 2.0]
    clean = np.ones(300, np.float32)
    kcuda.unscale_and_check_(clean, clean, 0.5, found, launch=(2, 64))  # never zeroed
    assert found[0] == 1.0 and clean.max() == 0.5


def test_update_scale_trajectory_matches_reference():
    script = [0, 0, 0, 1, 0, np.nan, 0, 0, np.inf, 0, 0, 0]
    for start, growth, backoff, interval in [(65536.0, 2.0, 0.5, 3), (2.0 ** 127, 2.0, 0.5, 1)]:
        s1, t1, f1 = np.array([start], np.float32), np.zeros(1, np.int32), np.zeros(1, np.float32)
        s2, t2, f2 = s1.copy(), t1.copy(), f1.copy()
        for step, value in enumerate(script):
            f1[0] = f2[0] = value
            kcuda.update_scale_(s1, t1, f1, growth, backoff, interval)
            ref.update_scale_(s2, t2, f2, growth, backoff, interval)
            assert s1.tobytes() == s2.tobytes() and t1[0] == t2[0], (start, step)


@pytest.mark.parametrize("grid", GRIDS)
def test_master_to_model_round_to_nearest_even(grid):
    rng = np.random.default_rng(2)
    h = fp16_patterns(2048, seed=3)
    v = h[np.isfinite(h)].astype(np.float32)
    ties = v.view(np.uint32) + np.uint32(1 << 12)  # halfway to the next fp16 (normals)
    master = np.concatenate([specials(np.float32), v, ties.view(np.float32),
                             rng.standard_normal(500).astype(np.float32) * 70000])
    model = np.empty(master.size, np.float16)
    kcuda.master_to_model(master, model, launch=grid)
    with np.errstate(all="ignore"):
        assert np.array_equal(model.view(np.uint16), master.astype(np.float16).view(np.uint16))


def test_default_launch_is_small_in_the_simulator():
    assert kcuda._launch_config(4096, None) == (2, 64)
    assert kcuda._launch_config(10, None) == (1, 64)
    assert kcuda._launch_config(0, None)[0] == 0
