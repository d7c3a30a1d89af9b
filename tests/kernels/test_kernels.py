"""AMP kernels: Numba CPU vs the NumPy reference, bit for bit; torch's loss-scale rule; checks.

The CUDA kernels run the same oracles under Numba's simulator in tests/cuda/ (own process).
"""

import math
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

from procs import REPO, job_env

from minidist import kernels
from minidist.kernels import cpu, reference as ref

INV_SCALES = [1.0, 2.0 ** -16, 1 / 3, 0.5, 3.0, 65536.0]

SPECIAL32 = np.array(
    [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, -np.nan, 65504.0, -65504.0, 65519.99,
     65520.0, 65536.0, 1e30, -1e30, np.finfo(np.float32).max, -np.finfo(np.float32).max,
     np.finfo(np.float32).tiny, 2.0 ** -149, -(2.0 ** -149), 2.0 ** -24, 2.0 ** -25, 1e-40,
     3.0e38, 0.1, -7.5], dtype=np.float32)
SNAN32 = np.array([0x7F800001, 0xFF800001, 0x7FA00000, 0x7FC00001], np.uint32).view(np.float32)


def bits(a):
    return a.view(np.uint32 if a.dtype == np.float32 else np.uint16)


def assert_same_bits(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    diff = np.flatnonzero(bits(got) != bits(want))
    assert diff.size == 0, (f"{diff.size} elements differ, first at {diff[:5]}: "
                            f"{got.reshape(-1)[diff[:5]]} vs {want.reshape(-1)[diff[:5]]}")


@pytest.fixture(params=["serial", "parallel"])
def variant(request, monkeypatch):
    """Run the test with the plain loops, then with the prange loops (whatever the size)."""
    loops = cpu.SERIAL_LOOPS if request.param == "serial" else cpu.PARALLEL_LOOPS
    monkeypatch.setattr(cpu, "_loops", lambda numel: loops)
    return loops


def both_unscale(src, inv, in_place):
    """(found, dst) from the Numba kernel and from the reference, on copies of src."""
    out = []
    for impl in (cpu, ref):
        s = src.copy()
        dst = s if in_place else np.full(src.shape, 7.0, np.float32)
        with np.errstate(all="ignore"):
            found = impl.unscale_and_check(s, dst, inv)
        out.append((bool(found), dst))
    return out


# ----------------------------------------------------------------- unscale, bit for bit

@pytest.mark.parametrize("inv", INV_SCALES)
@pytest.mark.parametrize("in_place", [True, False])
def test_fp32_specials_match_reference(inv, in_place, variant):
    src = np.concatenate([SPECIAL32, SNAN32, -SPECIAL32])
    (f1, d1), (f2, d2) = both_unscale(src, inv, in_place)
    assert f1 is f2 is True
    assert_same_bits(d1, d2)


@pytest.mark.parametrize("inv", INV_SCALES)
def test_every_fp16_bit_pattern_to_fp32_master(inv, variant):
    src = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    (f1, d1), (f2, d2) = both_unscale(src, inv, in_place=False)
    assert f1 is f2 is True
    assert_same_bits(d1, d2)
    finite = src[np.isfinite(src)]  # and without the 2048 inf/NaN patterns: found is False
    (f1, d1), (f2, d2) = both_unscale(finite, inv, in_place=False)
    assert f1 is f2 is False
    assert_same_bits(d1, d2)


def test_fp16_decode_is_exact(variant):
    """The integer decode equals NumPy's float16 -> float32 cast on all 65536 patterns."""
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    got = np.empty(h.size, np.float32)
    variant.unscale_f16(h, got, np.float32(1.0))  # * 1.0 only quiets signaling NaNs
    with np.errstate(all="ignore"):
        want = h.view(np.float16).astype(np.float32) * np.float32(1.0)
    assert_same_bits(got, want)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("n", [0, 1, 2, 3, 7, 31, 33, 1000, 4099])
def test_odd_lengths_and_bad_value_positions(dtype, n, variant):
    rng = np.random.default_rng(n)
    clean = (rng.standard_normal(n) * 100).astype(dtype)
    for positions in ([], [0], [n - 1], [n // 2 - 1, n // 2], [n // 3]):
        src = clean.copy()
        for p, bad in zip(positions, (np.inf, np.nan)):
            if 0 <= p < n:
                src[p] = bad
        expect = bool(np.any(~np.isfinite(src)))
        for in_place in ([True, False] if dtype == np.float32 else [False]):
            (f1, d1), (f2, d2) = both_unscale(src, 1 / 1024, in_place)
            assert f1 is f2 is expect, (n, positions)
            assert_same_bits(d1, d2)


def test_every_position_of_a_single_inf_is_found(variant):
    n = 101
    for dtype in (np.float32, np.float16):
        dst = np.empty(n, np.float32)
        for i in range(n):
            src = np.ones(n, dtype)
            src[i] = -np.inf
            assert cpu.unscale_and_check(src, dst, 0.5), (dtype, i)
            assert dst[i] == -np.inf and dst[(i + 1) % n] == 0.5


def test_multidimensional_contiguous_arrays_are_flat():
    src = np.arange(12, dtype=np.float16).reshape(3, 4)
    dst = np.empty(12, np.float32)
    assert kernels.unscale_and_check(src, dst, 0.5) is False
    assert dst.tolist() == [i / 2 for i in range(12)]


def test_found_inf_is_set_never_cleared():
    src = np.ones(10, np.float32)
    found = np.ones(1, np.float32)  # a flag set by an earlier bucket of this step
    kernels.unscale_and_check_(src, src, 0.5, found)
    assert found[0] == 1.0 and src[0] == 0.5
    found[0] = 0.0
    kernels.unscale_and_check_(np.array([1, np.nan], np.float16), np.empty(2, np.float32),
                               np.array([0.5], np.float32), found)
    assert found[0] == 1.0


def test_inv_scale_array_and_number_agree():
    src = np.linspace(-3, 3, 999, dtype=np.float32)
    a, b = np.empty_like(src), np.empty_like(src)
    kernels.unscale_and_check(src, a, 1 / 3)
    kernels.unscale_and_check(src, b, np.array([1 / 3], np.float32))
    assert_same_bits(a, b)


# ----------------------------------------------------------------- master -> model

def fp32_around_every_fp16():
    """Every fp16 value as fp32, its fp32 neighbours, and the fp32 midpoints between fp16
    values (ties) with their neighbours: where round-to-nearest-even can go wrong."""
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    v = h[np.isfinite(h)].astype(np.float32)
    v = np.unique(v)
    mid = (v[:-1].astype(np.float64) + v[1:]) / 2  # exact in float64, exact in float32 too
    mid = mid.astype(np.float32)
    u = np.concatenate([v, mid]).view(np.uint32)
    return np.concatenate([u, u + 1, u - 1]).view(np.float32)


def test_master_to_model_matches_numpy_astype(variant):
    rng = np.random.default_rng(0)
    random_bits = rng.integers(0, 1 << 32, 300_000, dtype=np.uint64).astype(np.uint32)
    nans = (rng.integers(1, 1 << 23, 2000, dtype=np.uint32) | 0x7F800000)
    master = np.concatenate([fp32_around_every_fp16(), SPECIAL32, SNAN32, -SPECIAL32,
                             random_bits.view(np.float32), nans.view(np.float32),
                             (nans | 0x80000000).view(np.float32)])
    model = np.empty(master.size, np.float16)
    kernels.master_to_model(master, model)
    with np.errstate(all="ignore"):
        assert_same_bits(model, master.astype(np.float16))


@pytest.mark.skipif(os.environ.get("MINIDIST_EXHAUSTIVE") != "1",
                    reason="all 2^32 float32 patterns (5-13 min on 2 cores); set MINIDIST_EXHAUSTIVE=1")
@pytest.mark.timeout(3600)
def test_master_to_model_all_float32_patterns():
    chunk = 1 << 24
    model = np.empty(chunk, np.float16)
    for start in range(0, 1 << 32, chunk):
        master = np.arange(start, start + chunk, dtype=np.uint64).astype(np.uint32)
        cpu.PARALLEL_LOOPS.to_half(master, model.view(np.uint16))
        with np.errstate(all="ignore"):
            want = master.view(np.float32).astype(np.float16)
        assert np.array_equal(bits(model), bits(want)), hex(start)


# ----------------------------------------------------------------- loss-scale update

def torch_rule(scale, tracker, found, growth=2.0, backoff=0.5, interval=2000):
    """torch's _amp_update_scale_cpu_kernel (AmpGradScalerKernels.cpp), written out by hand."""
    if found:
        return float(np.float32(scale * backoff)), 0
    t = tracker + 1
    if t == interval:
        new = np.float32(scale * growth)
        return (float(new) if np.isfinite(new) else scale), 0
    return scale, t


def scripted_found(steps, seed):
    rng = np.random.default_rng(seed)
    return rng.choice(np.array([0.0, 0.0, 0.0, 0.0, 1.0, np.nan, np.inf], np.float32), steps)


@pytest.mark.parametrize("impl", [kernels, cpu, ref], ids=["dispatch", "cpu", "reference"])
@pytest.mark.parametrize("start, growth, backoff, interval", [
    (65536.0, 2.0, 0.5, 3), (2.0 ** 126, 2.0, 0.5, 2), (1.0, 1.5, 0.25, 1), (3.0, 2.0, 0.5, 2000)])
def test_update_scale_trajectory(impl, start, growth, backoff, interval):
    found_seq = np.concatenate([np.zeros(2 * interval + 1, np.float32), scripted_found(400, 1)])
    scale = np.array([start], np.float32)
    tracker = np.zeros(1, np.int32)
    found = np.zeros(1, np.float32)
    want_scale, want_tracker = float(scale[0]), 0
    with np.errstate(over="ignore"):
        for step, f in enumerate(found_seq):
            found[0] = f
            impl.update_scale_(scale, tracker, found, growth, backoff, interval)
            want_scale, want_tracker = torch_rule(want_scale, want_tracker, f != 0, growth,
                                                  backoff, interval)
            assert (float(scale[0]), int(tracker[0])) == (want_scale, want_tracker), step
    if start == 2.0 ** 126:  # it tried to grow past float32 max and kept the scale
        assert math.isfinite(scale[0])


def test_update_scale_matches_torch():
    torch = pytest.importorskip("torch")
    found_seq = np.concatenate([np.zeros(7, np.float32), scripted_found(2000, 2)])
    for start, growth, backoff, interval in [(65536.0, 2.0, 0.5, 3), (2.0 ** 127, 2.0, 0.5, 1),
                                              (5.0, 1.1, 0.3, 2)]:
        ts, tt, tf = (torch.tensor([start]), torch.zeros(1, dtype=torch.int32),
                      torch.zeros(1))
        s, t, f = np.array([start], np.float32), np.zeros(1, np.int32), np.zeros(1, np.float32)
        for step, value in enumerate(found_seq):
            tf[0], f[0] = float(value), value
            torch._amp_update_scale_(ts, tt, tf, growth, backoff, interval)
            kernels.update_scale_(s, t, f, growth, backoff, interval)
            assert s.tobytes() == ts.numpy().tobytes() and int(t[0]) == int(tt[0]), step


def test_unscale_matches_torch():
    torch = pytest.importorskip("torch")
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    for inv in (2.0 ** -16, 1 / 3):
        g = torch.from_numpy(h.astype(np.float32))
        found_t = torch.zeros(1)
        torch._amp_foreach_non_finite_check_and_unscale_([g], found_t,
                                                         torch.tensor([inv], dtype=torch.float32))
        master, found = np.empty(h.size, np.float32), np.zeros(1, np.float32)
        kernels.unscale_and_check_(h, master, np.float32(inv), found)
        assert found[0] == found_t.item() == 1.0
        nan = np.isnan(master)
        assert np.array_equal(nan, np.isnan(g.numpy()))
        assert_same_bits(master[~nan], g.numpy()[~nan])


# ----------------------------------------------------------------- guards and dispatch

def test_no_kernel_uses_fastmath():
    """fastmath lets LLVM assume no inf/NaN: isfinite folds to True and the check vanishes."""
    from numba.core.registry import CPUDispatcher

    dispatchers = [v for v in [*vars(cpu).values(), *cpu.PARALLEL_LOOPS, *cpu.SERIAL_LOOPS]
                   if isinstance(v, CPUDispatcher)]
    assert len(dispatchers) >= 12
    for d in dispatchers:
        assert not d.targetoptions.get("fastmath"), d.py_func.__name__
    assert "fastmath" not in (REPO / "minidist/kernels/cpu.py").read_text().replace(
        "No ``fastmath``", "")


def test_numpy_arrays_use_numba_cpu():
    assert kernels.implementation(np.zeros(1, np.float32)) == "numba-cpu"
    assert cpu._loops(10) is cpu.SERIAL_LOOPS
    with pytest.raises(ValueError, match="NumPy or CuPy array"):
        kernels.implementation([1.0])


def test_fallback_warns_once_and_gives_the_same_bits(monkeypatch):
    backend = kernels._CPU
    monkeypatch.setattr(backend, "module_name", "minidist.kernels.no_such_module")
    backend.reset()
    try:
        src = np.array([1.0, np.inf, 3.0], np.float32)
        dst = np.empty(3, np.float32)
        with pytest.warns(RuntimeWarning, match="numba-cpu kernels cannot run here"):
            assert kernels.unscale_and_check(src, dst, 0.5) is True
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert kernels.implementation(src) == "reference"
            kernels.unscale_and_check(src, dst, 0.5)
        assert dst.tolist() == [0.5, np.inf, 1.5]
    finally:
        monkeypatch.undo()
        backend.reset()
    assert kernels.implementation(src) == "numba-cpu"


def test_import_is_lazy_and_env_choice():
    code = ("import sys, warnings, numpy as np; warnings.simplefilter('error')\n"
            "import minidist, minidist.kernels as k\n"
            "assert 'numba' not in sys.modules, 'import minidist imported numba'\n"
            "print(k.implementation(np.zeros(1, np.float32)))\n"
            "assert 'numba' not in sys.modules\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         env=job_env({"MINIDIST_KERNELS": "reference"}), timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == "reference", res.stderr


def test_threads_and_chunk_tails_in_a_fresh_process():
    """3 Numba threads on the workqueue layer (not thread-safe): the kernels' lock, prange
    chunk boundaries, and 4 Python threads calling at once (the threads transport)."""
    env = job_env({"NUMBA_NUM_THREADS": "3", "NUMBA_THREADING_LAYER": "workqueue"})
    res = subprocess.run([sys.executable, str(REPO / "tests/kernels/kernels_threads_rank.py")],
                         env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "threads ok" in res.stdout, res.stdout + res.stderr


def test_one_thread_unless_numba_threads_are_requested():
    """Without NUMBA_NUM_THREADS the kernels never wake Numba's pool (one thread per core by
    default, which ranks sharing the cores turn into a 30-60x slowdown); with it they do."""
    code = ("import numpy as np\n"
            "from minidist.kernels import cpu\n"
            "big = cpu.PARALLEL_MIN_NUMEL * 2\n"
            "print(cpu.THREADS_REQUESTED, cpu._loops(big) is cpu.PARALLEL_LOOPS)\n")
    env = job_env()
    env.pop("NUMBA_NUM_THREADS", None)
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         env=env, timeout=120)
    assert res.returncode == 0 and res.stdout.split() == ["False", "False"], res.stderr
    env["NUMBA_NUM_THREADS"] = "2"
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         env=env, timeout=120)
    assert res.returncode == 0 and res.stdout.split() == ["True", "True"], res.stderr


# ----------------------------------------------------------------- argument checks

def f32(n=4):
    return np.ones(n, np.float32)


@pytest.mark.parametrize("call, match", [
    (lambda: kernels.unscale_and_check(f32(), np.ones(4, np.float16), 1.0),
     "dst has dtype float16"),
    (lambda: kernels.unscale_and_check(np.ones(4), f32(), 1.0), "src has dtype float64"),
    (lambda: kernels.unscale_and_check(f32(4), f32(5), 1.0), "src has 4 elements but dst has 5"),
    (lambda: kernels.unscale_and_check(f32(8)[::2], f32(4), 1.0), "not C-contiguous"),
    (lambda: kernels.unscale_and_check([1.0], f32(1), 1.0), "NumPy or CuPy array"),
    (lambda: kernels.unscale_and_check(f32(), f32(), "x"), "inv_scale must be a number"),
    (lambda: kernels.unscale_and_check(f32(), f32(), np.ones(2, np.float32)), "inv_scale has 2"),
    (lambda: kernels.unscale_and_check(f32(), f32(), np.ones(1)), "inv_scale has dtype float64"),
    (lambda: kernels.unscale_and_check_(f32(), f32(), 1.0, np.zeros(1)), "found_inf has dtype"),
    (lambda: kernels.unscale_and_check_(f32(), f32(), 1.0, np.zeros(2, np.float32)),
     "found_inf has 2 elements"),
    (lambda: kernels.master_to_model(f32(), f32()), "model has dtype float32"),
    (lambda: kernels.master_to_model(np.ones(4, np.float16), np.ones(4, np.float16)),
     "master has dtype float16"),
    (lambda: kernels.update_scale_(f32(1), np.zeros(1, np.int64), f32(1), 2.0, 0.5, 10),
     "growth_tracker has dtype int64"),
    (lambda: kernels.update_scale_(f32(1), np.zeros(1, np.int32), f32(1), 2.0, 0.5, 0),
     "growth_interval must be an int >= 1"),
    (lambda: kernels.update_scale_(f32(2), np.zeros(1, np.int32), f32(1), 2.0, 0.5, 10),
     "scale has 2 elements"),
])
def test_bad_arguments_raise_clear_errors(call, match):
    with pytest.raises(ValueError, match=match) as info:
        call()
    assert str(info.value).startswith("[rank ") and "kernels." in str(info.value)


def test_overlap_and_read_only_are_refused_before_anything_changes():
    buf = np.arange(8, dtype=np.float32)
    before = buf.copy()
    with pytest.raises(ValueError, match="overlaps"):
        kernels.unscale_and_check(buf[:4], buf[2:6], 0.5)
    raw = np.zeros(16, np.uint8)
    with pytest.raises(ValueError, match="overlaps"):  # fp16 src viewing the fp32 dst's bytes
        kernels.unscale_and_check(raw[:8].view(np.float16), raw.view(np.float32), 0.5)
    ro = np.ones(4, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        kernels.unscale_and_check(ro, ro, 0.5)
    assert_same_bits(buf, before)


def test_docstring_examples_run():
    import doctest

    result = doctest.testmod(kernels)
    assert result.failed == 0 and result.attempted >= 5
