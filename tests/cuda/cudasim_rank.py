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


# ----------------------------------------------------------------- unrolled loop tails

@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("n", [3, 4 * 32 + 5, 4 * 128 - 1, 4 * 128 * 2 + 37])
def test_unrolled_tails_bit_exact(grid, n):
    """n not a multiple of 4 x grid: the unrolled trips and the one-element tail both run;
    inf/NaN in the last unrolled trip and in the tail are found."""
    threads = grid[0] * grid[1]
    for dtype in (np.float32, np.float16):
        for bad_at in (None, n - 1, max(0, (n // (4 * threads)) * 4 * threads - 1)):
            src = np.linspace(-40, 40, n).astype(dtype)
            if bad_at is not None:
                src[bad_at] = np.inf if bad_at % 2 else np.nan
            run_both(src, 1 / 3, in_place=False, grid=grid)
            if dtype == np.float32:
                run_both(src, 0.5, in_place=True, grid=grid)
    master = np.linspace(-7e4, 7e4, n).astype(np.float32)
    model = np.empty(n, np.float16)
    kcuda.master_to_model(master, model, launch=grid)
    with np.errstate(all="ignore"):
        assert np.array_equal(model.view(np.uint16), master.astype(np.float16).view(np.uint16))


# ----------------------------------------------------------------- launch plans

def test_a_second_call_on_the_same_buffers_builds_nothing():
    kcuda.clear_plans()
    grads, found = np.ones(300, np.float32), np.zeros(1, np.float32)
    kcuda.unscale_and_check_(grads, grads, 0.5, found)
    first = kcuda.PLAN_STATS.as_dict()
    for inv in (2.0, 0.25, 4.0):
        kcuda.unscale_and_check_(grads, grads, inv, found)
    after = kcuda.PLAN_STATS.as_dict()
    for counter in ("plans_built", "views_built", "streams_built"):
        assert after[counter] == first[counter], counter
    assert after["launches"] == first["launches"] + 3
    assert grads.tolist() == [1.0] * 300 and found[0] == 0.0
    other = np.ones(300, np.float32)  # another buffer: a new plan (the slower path)
    kcuda.unscale_and_check_(other, other, 0.5, found)
    assert kcuda.PLAN_STATS.plans_built == after["plans_built"] + 1
    s, t = np.array([8.0], np.float32), np.zeros(1, np.int32)
    for _ in range(3):
        kcuda.update_scale_(s, t, found, 2.0, 0.5, 2000)
    assert kcuda.PLAN_STATS.plans_built == after["plans_built"] + 2


def test_a_small_grid_is_configured_without_numbas_occupancy_warning():
    import warnings

    class Kernel:
        __name__ = "k"

        def __getitem__(self, config):
            warnings.warn("Grid size 1 will likely result in GPU under-utilization due to low "
                          "occupancy.", UserWarning, stacklevel=2)
            return lambda *a: None

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kcuda.LaunchPlan(Kernel(), (), 1, 1, 0).launch()


# ----------------------------------------------------------------- one launch for many buffers

def test_foreach_joins_pieces_of_one_buffer_and_matches_the_reference():
    kcuda.clear_plans()
    rng = np.random.default_rng(5)
    flat = (rng.standard_normal(900) * 100).astype(np.float32)
    flat[[5, 700]] = [np.inf, np.nan]
    sizes = [100, 7, 300, 493]
    views = np.split(flat, np.cumsum(sizes)[:-1])        # consecutive pieces of one buffer
    want = flat.copy()
    want_found = ref.unscale_and_check(want, want, 0.25)
    found = np.zeros(1, np.float32)
    before = kcuda.PLAN_STATS.as_dict()
    kcuda.foreach_unscale_and_check_(views, views, 0.25, found)
    after = kcuda.PLAN_STATS.as_dict()
    assert after["launches"] - before["launches"] == 1       # joined: one buffer, one launch
    layouts = list(kcuda._FOREACH.values())                  # indices only: nothing kept alive
    assert layouts == [[[kcuda.Run(0, 3, 900, True, "f")]]]
    assert want_found and found[0] == 1.0
    assert np.array_equal(flat.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("count", [2, 5, 17, 40])
def test_foreach_separate_buffers_mixed_dtypes(count):
    kcuda.clear_plans()
    rng = np.random.default_rng(count)
    srcs, dsts, want = [], [], []
    for k in range(count):
        n = int(rng.integers(1, 90))
        dtype = np.float16 if k % 3 == 0 else np.float32
        src = (rng.standard_normal(n) * 50).astype(dtype)
        if k == count - 1:
            src[-1] = np.inf
        srcs.append(src)
        dst = src if (dtype == np.float32 and k % 2) else np.full(n, 7.0, np.float32)
        dsts.append(dst)
        w = src.astype(np.float32) * np.float32(0.5) if True else None
        want.append(w)
    found = np.zeros(1, np.float32)
    before = kcuda.PLAN_STATS.launches
    with np.errstate(all="ignore"):
        kcuda.foreach_unscale_and_check_(srcs, dsts, 0.5, found)
    launches = kcuda.PLAN_STATS.launches - before
    groups16 = sum(1 for k in range(count) if k % 3 == 0)
    expect = -(-groups16 // 16) + -(-(count - groups16) // 16)
    assert launches == expect, (launches, expect)
    assert found[0] == 1.0
    for d, w in zip(dsts, want):
        assert np.array_equal(d.view(np.uint32), w.view(np.uint32))
    again = kcuda.PLAN_STATS.plans_built
    with np.errstate(all="ignore"):
        kcuda.foreach_unscale_and_check_(srcs, [np.empty(s.size, np.float32) for s in srcs],
                                         np.float32(1.0), found)
    assert kcuda.PLAN_STATS.plans_built >= again  # new dsts: new plans (a temporary list)


def test_update_scale_reads_and_resets_every_flag():
    s, t = np.array([1024.0], np.float32), np.array([5], np.int32)
    flags = np.array([0.0, 0.0, 1.0, 0.0], np.float32)
    kcuda.update_scale_(s, t, flags, 2.0, 0.5, 2000)
    assert s[0] == 512.0 and t[0] == 0 and flags.tolist() == [0.0] * 4
    kcuda.update_scale_(s, t, flags, 2.0, 0.5, 2000)
    assert s[0] == 512.0 and t[0] == 1


# ----------------------------------------------------------------- the fallback, CUDA side

@pytest.mark.parametrize("error", [AttributeError, RuntimeError])
def test_cuda_kernels_that_cannot_compile_fall_back_once(monkeypatch, error):
    """A numba.cuda whose kernels import but raise on their first launch (after writing half
    of the output): one warning, the reference result, the caller's data never half-written."""
    import warnings

    from minidist.kernels.fallback import CompiledBackend

    class Broken:
        __name__ = "broken"

        def __getitem__(self, config):
            def launch(*args):
                for a in args:
                    if isinstance(a, np.ndarray) and a.size > 1:
                        a[: a.size // 2] = -1.0
                raise error("module 'numpy' has no attribute 'row_stack'")
            return launch

    for name in ("unscale_kernel", "unscale_kernel_device_inv", "to_half_kernel",
                 "foreach_unscale_kernel", "update_scale_kernel"):
        monkeypatch.setattr(kcuda, name, Broken())
    monkeypatch.setattr(kcuda, "check_usable", lambda: None)
    kcuda.clear_plans()
    fused = CompiledBackend("numba-cuda", "minidist.kernels.cuda", "Install numba-cuda-mlir.")
    grads = np.array([2.0, 4.0, 8.0, np.inf] * 40, np.float32)
    found = np.zeros(1, np.float32)
    with pytest.warns(RuntimeWarning, match="numba-cuda kernels cannot run here.*row_stack"):
        fused.call("unscale_and_check_", ref.unscale_and_check_, grads, grads, 0.5, found)
    assert grads[:4].tolist() == [1.0, 2.0, 4.0, np.inf] and found[0] == 1.0
    model = np.empty(160, np.float16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fused.call("master_to_model", ref.master_to_model, grads, model)
    assert model[:3].tolist() == [1.0, 2.0, 4.0]
    kcuda.clear_plans()


def test_direct_launch_of_the_compiled_kernel_and_its_fallback(monkeypatch):
    """After the first launch a plan launches the compiled kernel directly (what the
    dispatcher chose for these argument types); if that API does not fit, the plan goes back
    to the dispatcher at once, nothing launched twice."""
    calls = []

    class Compiled:
        def __init__(self, broken):
            self.broken = broken

        def launch(self, args, griddim, blockdim, stream, sharedmem):
            if self.broken:
                raise TypeError("launch() takes 3 positional arguments")
            calls.append(("direct", args, griddim, stream))

    class Kernel:
        __name__ = "k"

        def __init__(self, broken):
            self.overloads = {("f4",): Compiled(broken)}

        def typeof_pyval(self, value):
            return "f4"

        def __getitem__(self, config):
            launcher = lambda *args: calls.append(("dispatcher", args))  # noqa: E731
            launcher.griddim, launcher.blockdim, launcher.stream = (3, 1, 1), (64, 1, 1), "s"
            return launcher

    monkeypatch.setattr(kcuda, "SIMULATOR", False)
    monkeypatch.setattr(kcuda, "FAST_LAUNCH", True)
    plan = kcuda.LaunchPlan(Kernel(broken=False), (), 3, 64, 0)
    for v in (1.0, 2.0, 3.0):
        plan.launch(v)
    assert calls == [("dispatcher", (1.0,)), ("direct", (2.0,), (3, 1, 1), "s"),
                     ("direct", (3.0,), (3, 1, 1), "s")]
    calls.clear()
    plan = kcuda.LaunchPlan(Kernel(broken=True), (), 3, 64, 0)
    for v in (1.0, 2.0, 3.0):
        plan.launch(v)
    assert calls == [("dispatcher", (1.0,)), ("dispatcher", (2.0,)), ("dispatcher", (3.0,))]
    assert kcuda.FAST_LAUNCH is False


def test_grid_from_the_sm_count(monkeypatch):
    """Off the simulator: 8 blocks of 256 threads per SM at most, fewer for small n (each
    thread takes 4 elements per trip); under the simulator: at most 2 x 64."""
    monkeypatch.setattr(kcuda, "SIMULATOR", False)
    monkeypatch.setattr(kcuda, "_sm_count", 132)
    assert kcuda._launch_config(64 << 20, None) == (132 * 8, 256)
    assert kcuda._launch_config(1024, None) == (1, 256)
    assert kcuda._launch_config(1025, None) == (2, 256)
    assert kcuda._launch_config(300_000, None) == (293, 256)
    assert kcuda._launch_config(10, (3, 32)) == (3, 32)


def test_packed_launch_packs_arrays_once_and_scalars_every_call(monkeypatch):
    """Where Numba exposes its launch (numba-cuda 0.30: ``launch`` and ``LaunchConfig`` in the
    compiled kernel's module), a plan packs its array arguments once with the compiled
    kernel's own ``_prepare_args`` and launches through that ``launch``; scalars are packed
    per call; a different array object is not launched packed."""
    import sys
    import types

    fake = types.ModuleType("fake_numba_dispatcher")
    launched, prepared = [], []
    fake.launch = lambda stream, config, kernel, *kargs: launched.append((stream, config,
                                                                          kernel, kargs))
    fake.LaunchConfig = lambda grid, block, shmem_size: ("config", grid, block, shmem_size)
    monkeypatch.setitem(sys.modules, fake.__name__, fake)

    class Compiled:
        debug, extensions, cooperative = False, [], False
        argument_types = ("array", "float32", "array")

        class _codelibrary:  # noqa: N801
            @staticmethod
            def get_cufunc():
                return types.SimpleNamespace(kernel="handle")

        def _prepare_args(self, ty, value, stream, retr, out):
            prepared.append(ty)
            out.extend([("ptr", id(value))] if ty == "array" else [("f4", value)])

        def launch(self, args, griddim, blockdim, stream, sharedmem):
            launched.append(("compiled.launch", args))

    Compiled.__module__ = fake.__name__

    class Kernel:
        __name__ = "k"
        overloads = {("t", "t", "t"): Compiled()}

        def typeof_pyval(self, value):
            return "t"

        def __getitem__(self, config):
            launcher = lambda *args: launched.append(("dispatcher", args))  # noqa: E731
            launcher.griddim, launcher.blockdim, launcher.stream = (3, 1, 1), (64, 1, 1), "s"
            return launcher

    monkeypatch.setattr(kcuda, "SIMULATOR", False)
    monkeypatch.setattr(kcuda, "FAST_LAUNCH", True)
    a, f = np.zeros(4, np.float32), np.zeros(1, np.float32)
    plan = kcuda.LaunchPlan(Kernel(), (a, f), 3, 64, 0)
    before = kcuda.PLAN_STATS.packed_launches
    plan.launch(a, np.float32(0.5), f)          # the dispatcher; then packed: a and f once
    assert launched.pop(0) == ("dispatcher", (a, np.float32(0.5), f))
    assert prepared == ["array", "array"]
    plan.launch(a, np.float32(2.0), f)
    plan.launch(a, np.float32(4.0), f)
    assert prepared == ["array", "array", "float32", "float32"]   # arrays never again
    assert launched == [("s", ("config", (3, 1, 1), (64, 1, 1), 0), "handle",
                         (("ptr", id(a)), ("f4", v), ("ptr", id(f)))) for v in (2.0, 4.0)]
    assert kcuda.PLAN_STATS.packed_launches == before + 2
    launched.clear()
    other = np.zeros(4, np.float32)
    plan.launch(other, np.float32(1.0), f)      # not the packed array: the compiled launch
    assert launched == [("compiled.launch", (other, np.float32(1.0), f))]
    launched.clear()
    monkeypatch.setattr(kcuda, "FAST_LAUNCH", False)   # MINIDIST_CUDA_LAUNCH=dispatcher
    plan.launch(a, np.float32(1.0), f)
    assert launched == [("dispatcher", (a, np.float32(1.0), f))]


def test_the_cuda_backend_through_the_fallback_policy(monkeypatch):
    """Every op through CompiledBackend (rehearsal on private copies, then the real call) on
    the simulated CUDA kernels: the reference's bits, no warning, one rehearsal per op."""
    import warnings

    from minidist.kernels.fallback import CompiledBackend

    monkeypatch.setattr(kcuda, "check_usable", lambda: None)
    fused = CompiledBackend("numba-cuda", "minidist.kernels.cuda", "")
    rng = np.random.default_rng(9)
    g16 = (rng.standard_normal(300) * 100).astype(np.float16)
    g16[17] = np.inf
    parts = [(rng.standard_normal(n) * 10).astype(np.float32) for n in (5, 200, 64)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            got, want = np.empty(300, np.float32), np.empty(300, np.float32)
            f1, f2 = np.zeros(1, np.float32), np.zeros(1, np.float32)
            fused.call("unscale_and_check_", ref.unscale_and_check_, g16, got, 0.5, f1)
            with np.errstate(all="ignore"):
                ref.unscale_and_check_(g16, want, 0.5, f2)
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)) and f1[0] == f2[0]
            a = [p.copy() for p in parts]
            b = [p.copy() for p in parts]
            fused.call("foreach_unscale_and_check_", ref.foreach_unscale_and_check_, a, a, 0.25,
                       f1)
            ref.foreach_unscale_and_check_(b, b, 0.25, f2)
            assert all(np.array_equal(x, y) for x, y in zip(a, b))
            model = np.empty(300, np.float16)
            fused.call("master_to_model", ref.master_to_model, got, model)
            with np.errstate(all="ignore"):
                assert np.array_equal(model.view(np.uint16), got.astype(np.float16).view(np.uint16))
            s, t = np.array([64.0], np.float32), np.zeros(1, np.int32)
            fused.call("update_scale_", ref.update_scale_, s, t, f1, 2.0, 0.5, 10)
            assert s[0] == 32.0 and f1[0] == 0.0
    assert fused.module is kcuda and len(fused.rehearsed) == 4
