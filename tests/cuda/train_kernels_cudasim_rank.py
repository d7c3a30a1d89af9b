"""The fused optimizer kernels (and the CUDA-IPC reduce kernel) under Numba's simulator.

Run by test_train_kernels_cudasim.py in its own process with NUMBA_ENABLE_CUDASIM=1. The
simulator runs the kernels' Python on NumPy scalars, so the results must equal the default
NumPy path of ``minidist.optim`` bit for bit. Sizes stay small (n <= 1500, grid 2 x 64, n not
a multiple of 128: the grid-stride tail runs).
"""

import numpy as np
import pytest

from minidist import optim
from minidist.kernels import optim_cuda
from minidist.nn import Parameter

pytestmark = [pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]

N = 1001


def test_running_in_the_simulator():
    from numba import config

    assert config.ENABLE_CUDASIM and optim_cuda.SIMULATOR
    with pytest.raises(RuntimeError, match="simulator"):
        optim_cuda.check_usable()
    assert optim_cuda.launch_config(4096) == (2, 64)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kw", [dict(lr=0.1), dict(lr=0.1, momentum=0.9),
                                dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01),
                                dict(lr=0.1, momentum=0.8, dampening=0.3, weight_decay=0.1)])
def test_sgd_kernel_equals_default_path(kw, dtype):
    rng = np.random.default_rng(0)
    p0 = rng.standard_normal(N).astype(dtype)
    ref = Parameter(p0.copy())
    opt = optim.SGD([ref], **kw)
    p, buf = p0.copy(), np.zeros(N, dtype)
    dt = np.dtype(dtype).type
    for step in range(3):
        g = rng.standard_normal(N).astype(dtype)
        ref.grad = g.copy()
        opt.step()
        entry = opt.fused_kernel(opt.param_groups[0])
        states = (buf,) if entry.state else ()
        scalars = tuple(x if isinstance(x, bool) else dt(x)
                        for x in entry.scalars(opt.param_groups[0], 0, step == 0))
        optim_cuda.flat_step(entry, p, g, states, scalars, launch=(2, 64))
        assert np.array_equal(p, ref.array), (step, np.abs(p - ref.array).max())


@pytest.mark.parametrize("decoupled", [False, True])
def test_adam_kernel_equals_default_path(decoupled):
    import math

    rng = np.random.default_rng(1)
    p0 = rng.standard_normal(N).astype(np.float32)
    ref = Parameter(p0.copy())
    lr, b1, b2, eps, wd = 3e-3, 0.8, 0.99, 1e-6, 0.1
    opt = (optim.AdamW if decoupled else optim.Adam)([ref], lr=lr, betas=(b1, b2), eps=eps,
                                                    weight_decay=wd)
    p, m, v = p0.copy(), np.zeros(N, np.float32), np.zeros(N, np.float32)
    f = np.float32
    for t in range(1, 4):
        g = rng.standard_normal(N).astype(np.float32)
        g[5] = 0.0
        ref.grad = g.copy()
        opt.step()
        optim_cuda.flat_step(opt.fused_kernel(opt.param_groups[0]), p, g, (m, v),
                             (f(1 - lr * wd if decoupled else 1.0), f(0.0 if decoupled else wd),
                              f(b1), f(1 - b1), f(b2), f(1 - b2), f(math.sqrt(1 - b2 ** t)),
                              f(eps), f(lr / (1 - b1 ** t))), launch=(2, 64))
        assert np.array_equal(p, ref.array), (t, np.abs(p - ref.array).max())
        assert np.array_equal(m, opt.state[0]["exp_avg"])
        assert np.array_equal(v, opt.state[0]["exp_avg_sq"])


MULTI_SHAPES = [(33, 7), (7,), (301,), (1,), (64, 2)]


@pytest.mark.parametrize("make", [
    lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01),
    lambda ps: optim.SGD(ps, lr=0.1),
    lambda ps: optim.AdamW(ps, lr=1e-2),
    lambda ps: optim.Adam(ps, lr=1e-2, weight_decay=0.05),
])
def test_multi_tensor_kernels_equal_default_path(make):
    """The multi-tensor launch (one launch over separate allocations, through the table of
    minidist.optim.multi_tensor) gives the default path's bits, tail runs included."""
    from minidist.optim import multi_tensor

    rng = np.random.default_rng(3)
    p0 = [rng.standard_normal(s).astype(np.float32) for s in MULTI_SHAPES]
    ref = [Parameter(p.copy()) for p in p0]
    mine = [p.copy() for p in p0]
    opt = make(ref)
    sgd = isinstance(opt, optim.SGD)
    momentum = sgd and opt.param_groups[0]["momentum"] != 0
    state = [[np.zeros_like(p) for _ in range(1 if sgd else 2)] for p in mine]
    for t in range(1, 4):
        gs = [rng.standard_normal(p.shape).astype(np.float32) for p in mine]
        for r, g in zip(ref, gs):
            r.grad = g.copy()
        opt.step()
        group = opt.param_groups[0]
        f = np.float32
        entry = opt.fused_kernel(group)
        if sgd:
            items = [(p, g, s[0]) if momentum else (p, g) for p, g, s in zip(mine, gs, state)]
            table = multi_tensor.table_of(items)
            scalars = (f(group["lr"]), f(group["momentum"]), f(1.0), f(group["weight_decay"]),
                       False, t == 1) if momentum else (f(group["lr"]), f(group["weight_decay"]))
            optim_cuda.multi_step(entry, table.base, table.offsets, table.max_numel, scalars,
                                  launch=(2, 64))
        else:
            import math

            lr, wd, (b1, b2), eps = group["lr"], group["weight_decay"], group["betas"], 1e-8
            decoupled = isinstance(opt, optim.AdamW)
            table = multi_tensor.table_of([(p, g, *s) for p, g, s in zip(mine, gs, state)])
            optim_cuda.multi_step(
                entry, table.base, table.offsets, table.max_numel,
                (f(1 - lr * wd if decoupled else 1.0), f(0.0 if decoupled else wd), f(b1),
                 f(1 - b1), f(b2), f(1 - b2), f(math.sqrt(1 - b2 ** t)), f(eps),
                 f(lr / (1 - b1 ** t))), launch=(2, 64))
        for p, r in zip(mine, ref):
            assert np.array_equal(p, r.array), (t, np.abs(p - r.array).max())


def test_multi_tensor_rehearsal_runs_on_a_private_table():
    base = np.zeros(10, np.float32)
    table = np.array([[0, 3, 6, 2]], np.int64)
    from minidist.optim.sgd import SGD_MOMENTUM

    optim_cuda.rehearse("multi_step", SGD_MOMENTUM, base, table, 2,
                        (np.float32(0.1), np.float32(0.9), np.float32(1.0), np.float32(0.0),
                         False, True))
    assert not base.any()  # the caller's arrays are not touched


@pytest.mark.parametrize("name", sorted(optim.FUSED_STEPS))
def test_every_registered_fused_step_runs_as_its_reference(name):
    """Each registry entry's two kernels (a flat run, a multi-tensor table) give the bits of
    its element function on whole arrays, from the same random state and scalars."""
    from minidist.kernels import optim_math
    from minidist.optim import multi_tensor

    entry = optim.FUSED_STEPS[name]
    group = dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01, nesterov=False,
                 betas=(0.9, 0.99), eps=1e-6, alpha=0.9)
    rng = np.random.default_rng(7)
    shapes = [(301,), (7,), (1,)]
    width = 2 + len(entry.state)
    want = [[rng.uniform(0.5, 1.0, s).astype(np.float32) for _ in range(width)] for s in shapes]
    flat = [[a.copy() for a in arrays] for arrays in want]
    multi = [[a.copy() for a in arrays] for arrays in want]
    for step in (1, 2):
        scalars = tuple(x if isinstance(x, bool) else np.float32(x)
                        for x in entry.scalars(group, step, step == 1))
        for arrays in want:
            optim_math.flat_step_reference(entry, arrays[0], arrays[1], tuple(arrays[2:]),
                                           scalars)
        for arrays in flat:
            optim_cuda.flat_step(entry, arrays[0], arrays[1], tuple(arrays[2:]), scalars,
                                 launch=(2, 64))
        table = multi_tensor.table_of([tuple(arrays) for arrays in multi])
        optim_cuda.multi_step(entry, table.base, table.offsets, table.max_numel, scalars,
                              launch=(2, 64))
        for w, f, m in zip(want, flat, multi):
            for a, b, c in zip(w, f, m):
                assert np.array_equal(a, b) and np.array_equal(a, c), (name, step)


# ----------------------------------------------------------------------------- cuda_ipc reduce
@pytest.mark.parametrize("n", [2, 3, 8])
@pytest.mark.parametrize("dtype,op", [(np.float32, "sum"), (np.float16, "sum"),
                                      (np.float64, "prod"), (np.float32, "max"),
                                      (np.float32, "min"), (np.int32, "sum")])
def test_reduce_kernel_equals_rank_order_numpy(n, dtype, op):
    from minidist.comm.ops import reference_reduce
    from minidist.kernels import reduce_cuda

    rng = np.random.default_rng(n)
    m = 301
    srcs = [(rng.standard_normal(m) * 4).astype(dtype) for _ in range(n)]
    if np.dtype(dtype).kind == "f":
        srcs[0][3] = np.nan
        srcs[n - 1][5] = np.nan
        srcs[1][7] = np.inf
    want = reference_reduce(srcs, op)
    out = np.full(m, 7, dtype)
    reduce_cuda.reduce_slices(out, srcs, op, launch=(2, 64))
    assert np.array_equal(out.view(np.uint8), want.view(np.uint8)), op
    first = srcs[0].copy()  # out may be one of the sources (the rank's own window)
    reduce_cuda.reduce_slices(srcs[0], [first] + srcs[1:], op, launch=(2, 64))
    assert np.array_equal(srcs[0].view(np.uint8), want.view(np.uint8))


def test_reduce_kernel_refuses_bad_source_counts():
    from minidist.kernels import reduce_cuda

    a = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match="2 to 8"):
        reduce_cuda.reduce_slices(a, [a], "sum")


def test_cuda_ipc_call_through_launch_plans_builds_nothing_the_second_time():
    """The all-reduce's protocol on host windows with the reduce KERNEL (simulator): after one
    call per window half, further calls build no plan and no Numba view (PLAN_STATS)."""
    import threading

    from minidist.fastpath.cuda_ipc import ipc_state, run_cuda_ipc
    from minidist.comm.ops import ReduceOp
    from minidist.comm.transports.threads import run_threads
    from minidist.kernels import cuda as kcuda
    from minidist.kernels import reduce_cuda

    lock = threading.Lock()  # one simulated launch at a time (thread ranks share the simulator)

    def planner(out, sources, op):
        launch = reduce_cuda.reduce_plan(out, sources, op, launch=(1, 32))

        def locked():
            with lock:
                launch()
        return locked

    stats = []

    def body(t):
        state = ipc_state(t, "host", reduce_planner=planner)
        x = np.arange(301, dtype=np.float32) * (t.rank + 1)
        for call in range(5):
            if call == 2:  # both ranks' plans exist: a peer finishes a call only after
                with lock:  # every rank reduced, i.e. built its plan
                    stats.append(dict(kcuda.PLAN_STATS.as_dict()))
            y = x.copy()
            run_cuda_ipc(state, t, y, ReduceOp.SUM, 0)
            assert np.array_equal(y, np.arange(301, dtype=np.float32) * 3), call
        return state.plans_built

    assert run_threads(2, body, timeout_s=120) == [2, 2]
    after = kcuda.PLAN_STATS.as_dict()
    assert stats and all(s["plans_built"] == after["plans_built"] for s in stats), (stats, after)
    assert all(s["views_built"] == after["views_built"] for s in stats)
    assert after["launches"] >= 10
