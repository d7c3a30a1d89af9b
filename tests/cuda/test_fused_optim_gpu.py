"""The fused optimizer steps on a real GPU (CuPy arrays, numba.cuda), against the host path.

Skipped unless CuPy sees a GPU and numba.cuda can use it. CPU twins: tests/optim/
test_fused_optim.py (same expectations on NumPy arrays) and train_kernels_cudasim_rank.py (the
same kernels in the simulator). NVVM fuses multiply-adds, so results match the host's within
float rounding, not bit for bit.
"""

import numpy as np
import pytest

from minidist import optim
from minidist import xp as backend
from minidist.nn import Parameter
from minidist.optim import fused

pytestmark = pytest.mark.gpu

SHAPES = [(257, 33), (33,), (4096,), (1,)]


@pytest.fixture(scope="module")
def cp():
    if not backend.gpu_available():
        pytest.skip("no CuPy or no CUDA GPU")
    import cupy

    if fused.implementation(cupy.zeros(1, cupy.float32)) != "numba-cuda":
        pytest.skip("numba.cuda cannot run here (install numba-cuda[cu12] or [cu13])")
    return cupy


@pytest.mark.parametrize("make", [
    lambda ps, f: optim.AdamW(ps, lr=1e-2, fused=f),
    lambda ps, f: optim.Adam(ps, lr=1e-2, weight_decay=0.1, fused=f),
    lambda ps, f: optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01, fused=f),
])
def test_fused_on_device_equals_host_within_rounding(cp, make):
    rng = np.random.default_rng(0)
    p0 = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    host = [Parameter(p.copy()) for p in p0]
    dev = [Parameter(p.copy()) for p in p0]
    for p in dev:
        p.array = cp.asarray(p.array)
    opt_h, opt_d = make(host, False), make(dev, True)
    for step in range(10):
        for ph, pd in zip(host, dev):
            g = rng.standard_normal(ph.array.shape).astype(np.float32)
            ph.grad, pd.grad = g, cp.asarray(g)
        opt_h.step()
        opt_d.step()
    for ph, pd in zip(host, dev):
        np.testing.assert_allclose(cp.asnumpy(pd.array), ph.array, rtol=1e-5, atol=1e-6)


def test_flat_device_parameters_take_one_launch(cp, monkeypatch):
    sizes = [int(np.prod(s)) for s in SHAPES]
    flat_p, flat_g = cp.zeros(sum(sizes), cp.float32), cp.ones(sum(sizes), cp.float32)
    params, off = [], 0
    for s, n in zip(SHAPES, sizes):
        p = Parameter(np.zeros(s, np.float32))
        p.array, p.grad = flat_p[off:off + n].reshape(s), flat_g[off:off + n].reshape(s)
        params.append(p)
        off += n
    real = fused._CUDA.get()
    calls = []

    class Counting:
        def flat_step(self, entry, p, *args):
            calls.append(p.size)
            real.flat_step(entry, p, *args)

    class Rehearsed(set):  # the counting wrapper sees only the real calls
        def __contains__(self, key):
            return True

    monkeypatch.setattr(fused._CUDA, "module", Counting())
    monkeypatch.setattr(fused._CUDA, "rehearsed", Rehearsed())
    opt = optim.AdamW(params, lr=0.1, fused=True)
    opt.step()
    opt.step()
    assert calls == [sum(sizes)] * 2
    assert float(cp.abs(flat_p).max()) > 0


@pytest.mark.parametrize("make", [
    lambda ps, f: optim.AdamW(ps, lr=1e-2, fused=f),
    lambda ps, f: optim.SGD(ps, lr=0.1, momentum=0.9, fused=f),
])
def test_unflattened_device_parameters_take_one_launch_per_step(cp, monkeypatch, make):
    """18 separate device tensors: one multi-tensor launch per step through a cached plan
    (CPU twin: tests/optim/test_fused_optim.py::test_unflattened_18_tensor_mlp_...)."""
    from minidist.kernels import cuda as kcuda

    rng = np.random.default_rng(0)
    shapes = [(33, 17), (17,)] * 9
    p0 = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    host = [Parameter(p.copy()) for p in p0]
    dev = [Parameter(p.copy()) for p in p0]
    for p in dev:
        p.array = cp.asarray(p.array)
    real = fused._CUDA.get()
    calls = []

    class Counting:  # records every kernel launch (``signature``: the host-side cache key)
        def __getattr__(self, name):
            if name == "signature":
                return real.signature

            def counted(*args):
                calls.append(name)
                return getattr(real, name)(*args)
            return counted

    opt_h, opt_d = make(host, False), make(dev, True)
    grads = [[rng.standard_normal(s).astype(np.float32) for s in shapes] for _ in range(6)]
    for step, gs in enumerate(grads):
        if step == 2:  # compiled and rehearsed by now: count from here
            monkeypatch.setattr(fused._CUDA, "module", Counting())
            plans = kcuda.PLAN_STATS.plans_built
        for ph, pd, g in zip(host, dev, gs):
            ph.grad = g
            pd.grad = cp.asarray(g)
        opt_h.step()
        opt_d.step()
    assert len(calls) == 4 and all(c == "multi_step" for c in calls), calls
    assert kcuda.PLAN_STATS.plans_built - plans <= 4  # new grads, new addresses: a few plans
    for ph, pd in zip(host, dev):
        np.testing.assert_allclose(cp.asnumpy(pd.array), ph.array, rtol=1e-5, atol=1e-6)
