"""The kernels on every device, against the NumPy reference: each test body runs twice,
with ``xp=numpy`` (the Numba CPU kernels, in CI) and with ``xp=cupy`` (numba.cuda on a real GPU,
marked ``gpu``: skipped unless CuPy sees a GPU and the CUDA kernels can run). So a wrong
expectation fails on the CPU, without a GPU.

Finite results must be bit-identical; NaNs must be NaN in the same places (the GPU's float
conversions may canonicalize NaN payloads, which NumPy keeps).
"""

import contextlib

import numpy as np
import pytest

from minidist import kernels
from minidist import xp as backend
from minidist.kernels import reference as ref


@pytest.fixture(params=["numpy", pytest.param("cupy", marks=pytest.mark.gpu)])
def xp(request):
    """numpy (CPU kernels) or cupy (CUDA kernels; skipped without a GPU)."""
    if request.param == "numpy":
        assert kernels.implementation(np.zeros(1, np.float32)) == "numba-cpu"
        return np
    if not backend.gpu_available():
        pytest.skip("no CuPy or no CUDA GPU")
    import cupy

    if kernels.implementation(cupy.zeros(1, cupy.float32)) != "numba-cuda":
        pytest.skip("numba.cuda cannot run here (install minidist[gpu-cu12] or [gpu-cu13])")
    return cupy


def stream_of(xp):
    """A non-default stream on a GPU; nothing on the CPU."""
    if xp is np:
        return contextlib.nullcontext(), lambda: None
    stream = xp.cuda.Stream(non_blocking=True)
    return stream, stream.synchronize


def assert_same(got, want):
    got = backend.to_host(got)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    view = np.uint32 if want.dtype == np.float32 else np.uint16
    assert np.array_equal(got[~nan].view(view), want[~nan].view(view))


def test_every_fp16_pattern_to_master(xp):
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    for inv in (1.0, 2.0 ** -16, 1 / 3):
        master = xp.empty(h.size, xp.float32)
        found = kernels.unscale_and_check(xp.asarray(h), master, inv)
        want = np.empty(h.size, np.float32)
        with np.errstate(all="ignore"):
            assert ref.unscale_and_check(h, want, inv) is found is True
        assert_same(master, want)


def test_fp32_in_place_large_odd_length_device_flag(xp):
    rng = np.random.default_rng(0)
    host = rng.standard_normal(5_000_011).astype(np.float32)
    host[[0, 4_999_999, 5_000_010]] = [np.inf, np.nan, -np.inf]
    grads = xp.asarray(host).copy()
    found, inv = xp.zeros(1, xp.float32), xp.asarray([1 / 1024], dtype=xp.float32)
    kernels.unscale_and_check_(grads, grads, inv, found)
    want = host.copy()
    ref.unscale_and_check(want, want, np.float32(1 / 1024))
    assert float(found[0]) == 1.0
    assert_same(grads, want)


def test_foreach_one_flag_many_buffers(xp):
    rng = np.random.default_rng(3)
    flat = xp.asarray((rng.standard_normal(300_007) * 100).astype(np.float32))
    pieces = [flat[:1000], flat[1000:1001], flat[1001:250_000], flat[250_000:]]  # one buffer
    g16 = [xp.asarray(rng.standard_normal(n).astype(np.float16)) for n in (5, 77_777, 3)]
    masters = [xp.empty(g.size, xp.float32) for g in g16]
    want32, want16 = backend.to_host(flat) * np.float32(0.5), [
        backend.to_host(g).astype(np.float32) * np.float32(0.5) for g in g16]
    found = xp.zeros(1, xp.float32)
    kernels.foreach_unscale_and_check_(pieces + g16, pieces + masters, 0.5, found)
    assert float(found[0]) == 0.0
    assert_same(flat, want32)
    for m, w in zip(masters, want16):
        assert_same(m, w)
    g16[1][77_776] = np.inf
    kernels.foreach_unscale_and_check_(g16, masters, 0.5, found)
    assert float(found[0]) == 1.0


def test_runs_in_order_on_a_cupy_stream(xp):
    """Work queued on a non-default stream before and after the kernel stays in order."""
    stream, sync = stream_of(xp)
    with stream:
        x = xp.full(1 << 22, 3.0, xp.float32)
        found = xp.zeros(1, xp.float32)
        x *= 2  # queued on `stream`; the kernel must see 6.0, not 3.0
        kernels.unscale_and_check_(x, x, 0.5, found)
        total = x.sum()
    sync()
    assert float(total) == 3.0 * x.size and float(found[0]) == 0.0


def test_update_scale_stays_on_device_and_resets_the_flags(xp):
    script = [0, 0, 0, 1, 0, np.nan, 0, 0, np.inf, 0, 0, 0]
    s, t, f = xp.asarray([65536.0], xp.float32), xp.zeros(1, xp.int32), xp.zeros(2, xp.float32)
    hs, ht, hf = np.array([65536.0], np.float32), np.zeros(1, np.int32), np.zeros(2, np.float32)
    for value in script:
        f[1] = value
        hf[1] = value
        kernels.update_scale_(s, t, f, 2.0, 0.5, 3)
        ref.update_scale_(hs, ht, hf, 2.0, 0.5, 3)
        assert backend.to_host(f).tolist() == [0.0, 0.0]
    assert backend.to_host(s).tobytes() == hs.tobytes() and int(t[0]) == int(ht[0])


def test_master_to_model(xp):
    rng = np.random.default_rng(1)
    master = np.concatenate([rng.standard_normal(100_003).astype(np.float32) * 70000,
                             np.array([65504, 65519.99, 65520, 2.0 ** -25, 2.0 ** -24, 0.0,
                                       -0.0, np.inf], np.float32)])
    model = xp.empty(master.size, xp.float16)
    kernels.master_to_model(xp.asarray(master), model)
    with np.errstate(all="ignore"):
        assert_same(model, master.astype(np.float16))
