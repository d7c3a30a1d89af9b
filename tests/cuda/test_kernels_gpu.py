"""The CUDA kernels on a real GPU with CuPy arrays, against the NumPy reference.

Skipped unless CuPy sees a GPU and numba.cuda can use it. Finite results must be bit-identical;
NaNs must be NaN in the same places (the GPU's float conversions may canonicalize NaN
payloads, which NumPy keeps).
"""

import numpy as np
import pytest

from minidist import kernels
from minidist import xp as backend
from minidist.kernels import reference as ref

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cp():
    if not backend.gpu_available():
        pytest.skip("no CuPy or no CUDA GPU")
    import cupy

    if kernels.implementation(cupy.zeros(1, cupy.float32)) != "numba-cuda":
        pytest.skip("numba.cuda cannot run here (install numba-cuda[cu12] or [cu13])")
    return cupy


def assert_same(got, want):
    got = backend.to_host(got)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    view = np.uint32 if want.dtype == np.float32 else np.uint16
    assert np.array_equal(got[~nan].view(view), want[~nan].view(view))


def test_every_fp16_pattern_to_master(cp):
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    for inv in (1.0, 2.0 ** -16, 1 / 3):
        master = cp.empty(h.size, cp.float32)
        found = kernels.unscale_and_check(cp.asarray(h), master, inv)
        want = np.empty(h.size, np.float32)
        with np.errstate(all="ignore"):
            assert ref.unscale_and_check(h, want, inv) is found is True
        assert_same(master, want)


def test_fp32_in_place_large_odd_length_device_flag(cp):
    rng = np.random.default_rng(0)
    host = rng.standard_normal(5_000_011).astype(np.float32)
    host[[0, 4_999_999, 5_000_010]] = [np.inf, np.nan, -np.inf]
    grads = cp.asarray(host)
    found, inv = cp.zeros(1, cp.float32), cp.asarray([1 / 1024], dtype=cp.float32)
    kernels.unscale_and_check_(grads, grads, inv, found)
    want = host.copy()
    ref.unscale_and_check(want, want, np.float32(1 / 1024))
    assert float(found[0]) == 1.0
    assert_same(grads, want)


def test_runs_in_order_on_a_cupy_stream(cp):
    """Work queued on a non-default CuPy stream before and after the kernel stays in order."""
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        x = cp.full(1 << 22, 3.0, cp.float32)
        found = cp.zeros(1, cp.float32)
        x *= 2  # queued on `stream`; the kernel must see 6.0, not 3.0
        kernels.unscale_and_check_(x, x, 0.5, found)
        total = x.sum()
    stream.synchronize()
    assert float(total) == 3.0 * x.size and float(found[0]) == 0.0


def test_update_scale_stays_on_device(cp):
    script = [0, 0, 0, 1, 0, np.nan, 0, 0, np.inf, 0, 0, 0]
    s, t, f = cp.asarray([65536.0], cp.float32), cp.zeros(1, cp.int32), cp.zeros(1, cp.float32)
    hs, ht, hf = np.array([65536.0], np.float32), np.zeros(1, np.int32), np.zeros(1, np.float32)
    for value in script:
        f[0] = value
        hf[0] = value
        kernels.update_scale_(s, t, f, 2.0, 0.5, 3)
        ref.update_scale_(hs, ht, hf, 2.0, 0.5, 3)
    assert s.get().tobytes() == hs.tobytes() and int(t.get()[0]) == int(ht[0])


def test_master_to_model(cp):
    rng = np.random.default_rng(1)
    master = np.concatenate([rng.standard_normal(100_003).astype(np.float32) * 70000,
                             np.array([65504, 65519.99, 65520, 2.0 ** -25, 2.0 ** -24, 0.0,
                                       -0.0, np.inf], np.float32)])
    model = cp.empty(master.size, cp.float16)
    kernels.master_to_model(cp.asarray(master), model)
    with np.errstate(all="ignore"):
        assert_same(model, master.astype(np.float16))
