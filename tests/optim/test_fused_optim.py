"""Fused optimizer steps (``fused=True``): the same bits as the default path, torch's numbers,
one kernel call per flat buffer, and the default path for what the kernels cannot take."""

import threading

import numpy as np
import pytest

from minidist import optim
from minidist.nn import Parameter
from minidist.optim import fused

pytestmark = pytest.mark.filterwarnings("ignore:.*kernels cannot run here:RuntimeWarning")

SHAPES = [(7, 5), (5,), (3, 4, 2), (1,), (129,)]

SGD_CASES = [dict(lr=0.1), dict(lr=0.1, momentum=0.9),
             dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01),
             dict(lr=0.1, momentum=0.8, dampening=0.3, weight_decay=0.1)]
ADAM_CASES = [(optim.Adam, dict()), (optim.Adam, dict(weight_decay=0.05, lr=1e-2)),
              (optim.AdamW, dict()), (optim.AdamW, dict(lr=3e-3, betas=(0.8, 0.99), eps=1e-6,
                                                        weight_decay=0.1))]


def make_params(dtype, seed=0, shapes=SHAPES):
    rng = np.random.default_rng(seed)
    return [Parameter(rng.standard_normal(s).astype(dtype)) for s in shapes]


def grads_for(params, step, skip=None):
    rng = np.random.default_rng(100 + step)
    out = []
    for k, p in enumerate(params):
        g = rng.standard_normal(p.array.shape).astype(p.array.dtype)
        out.append(None if skip is not None and (k + step) % skip == 0 else g)
    return out


def run_pair(make_opt, dtype, steps=6, skip=None):
    """The same steps on two copies of the parameters: default path and fused=True."""
    a, b = make_params(dtype), make_params(dtype)
    opt_a, opt_b = make_opt(a, False), make_opt(b, True)
    for step in range(steps):
        for ps in (a, b):
            for p, g in zip(ps, grads_for(ps, step, skip)):
                p.grad = None if g is None else g.copy()
        opt_a.step()
        opt_b.step()
    return a, b, opt_a, opt_b


def assert_same_bits(a, b):
    for pa, pb in zip(a, b):
        assert pa.array.dtype == pb.array.dtype
        assert np.array_equal(pa.array, pb.array), np.abs(pa.array - pb.array).max()


needs_numba = pytest.mark.skipif(fused.implementation(np.zeros(1, np.float32)) != "numba-cpu",
                                 reason="numba is not usable here")


@needs_numba
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kw", SGD_CASES)
def test_sgd_fused_same_bits_as_default(kw, dtype):
    a, b, opt_a, opt_b = run_pair(lambda ps, f: optim.SGD(ps, fused=f, **kw), dtype, skip=3)
    assert_same_bits(a, b)
    for i, s in opt_a.state.items():
        assert np.array_equal(s["momentum_buffer"], opt_b.state[i]["momentum_buffer"])


@needs_numba
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("cls,kw", ADAM_CASES)
def test_adam_fused_same_bits_as_default(cls, kw, dtype):
    a, b, opt_a, opt_b = run_pair(lambda ps, f: cls(ps, fused=f, **kw), dtype, skip=4)
    assert_same_bits(a, b)
    for i, s in opt_a.state.items():
        sb = opt_b.state[i]
        assert s["step"] == sb["step"]
        assert np.array_equal(s["exp_avg"], sb["exp_avg"])
        assert np.array_equal(s["exp_avg_sq"], sb["exp_avg_sq"])


def test_fused_and_foreach_together_are_refused():
    with pytest.raises(RuntimeError, match="cannot be `True` together"):
        optim.AdamW(make_params(np.float32), fused=True, foreach=True)
    with pytest.raises(RuntimeError, match="cannot be `True` together"):
        optim.SGD(make_params(np.float32), lr=0.1, fused=True, foreach=True)
    opt = optim.SGD(make_params(np.float32), lr=0.1, foreach=True)  # accepted, as torch
    assert opt.param_groups[0]["foreach"] is True and opt.param_groups[0]["fused"] is None


def test_float16_and_non_contiguous_take_the_default_path():
    """What the kernels cannot take (fp16 on the CPU, a transposed view) gets the same numbers."""
    def make(dtype):
        rng = np.random.default_rng(5)
        ps = [Parameter(rng.standard_normal((6, 4)).astype(dtype)) for _ in range(2)]
        return ps
    for dtype in (np.float16, np.float32):
        a, b = make(dtype), make(dtype)
        opt_a, opt_b = optim.AdamW(a), optim.AdamW(b, fused=True)
        for step in range(3):
            for ps in (a, b):
                g = np.random.default_rng(step).standard_normal((4, 6)).astype(dtype)
                ps[0].grad = g.T  # non-contiguous
                ps[1].grad = g.T.copy()
            opt_a.step()
            opt_b.step()
        assert_same_bits(a, b)


class Rehearsed(set):
    """Every signature counts as rehearsed: the counting wrapper sees only the real calls."""

    def __contains__(self, key):
        return True


def count_calls(monkeypatch):
    counter = CountingKernels(fused._CPU.get())
    monkeypatch.setattr(fused._CPU, "module", counter)
    monkeypatch.setattr(fused._CPU, "rehearsed", Rehearsed())
    return counter


class CountingKernels:
    def __init__(self, real):
        self.real, self.calls = real, []

    def flat_step(self, entry, p, *args):
        self.calls.append(p.size)
        self.real.flat_step(entry, p, *args)

    def multi_step(self, entry, base, table, *args):  # one call for many tensors: their numel
        self.calls.append(int(table[:, -1].sum()))
        self.real.multi_step(entry, base, table, *args)


@needs_numba
@pytest.mark.parametrize("reverse_grads", [False, True])
def test_flat_parameters_and_grads_take_one_call(monkeypatch, reverse_grads):
    """Parameters viewing one flat buffer and gradients viewing another (in reverse order, as
    DDP's buckets lay them out): one kernel call per step, and the same bits as unflattened."""
    sizes = [int(np.prod(s)) for s in SHAPES]
    flat_p = np.concatenate([p.array.reshape(-1) for p in make_params(np.float32)])
    flat_g = np.zeros(sum(sizes), np.float32)
    params, grad_views, off = [], [], 0
    order = list(range(len(SHAPES)))
    goff = {k: o for k, o in zip(order[::-1] if reverse_grads else order,
                                 np.cumsum([0] + [sizes[k] for k in
                                                  (order[::-1] if reverse_grads else order)]))}
    for k, s in enumerate(SHAPES):
        params.append(Parameter(np.zeros(s, np.float32)))
        params[-1].array = flat_p[off:off + sizes[k]].reshape(s)
        grad_views.append(flat_g[goff[k]:goff[k] + sizes[k]].reshape(s))
        off += sizes[k]
    ref = make_params(np.float32)
    counter = count_calls(monkeypatch)
    opt, opt_ref = optim.AdamW(params, fused=True), optim.AdamW(ref)
    for step in range(3):
        gs = grads_for(ref, step)
        for p, view, g in zip(params, grad_views, gs):
            view[...] = g
            p.grad = view
        for p, g in zip(ref, gs):
            p.grad = g
        opt.step()
        opt_ref.step()
    # params and grads in opposite directions are one run per tensor, and the runs one
    # multi-tensor call: one call per step either way
    assert counter.calls == [sum(sizes)] * 3
    assert_same_bits(params, ref)
    sd = opt.state_dict()  # per-parameter views of the flat state, torch's layout
    assert sorted(sd["state"]) == list(range(len(SHAPES)))
    assert sd["state"][2]["exp_avg"].shape == SHAPES[2]


@needs_numba
def test_state_dict_round_trip_continues_identically():
    a, b = make_params(np.float32), make_params(np.float32)
    opt_a = optim.SGD(a, lr=0.1, momentum=0.9, fused=True)
    for step in range(2):
        for p, g in zip(a, grads_for(a, step)):
            p.grad = g
        opt_a.step()
    for pa, pb in zip(a, b):
        pb.array[...] = pa.array
    opt_b = optim.SGD(b, lr=0.1, momentum=0.9, fused=True)
    opt_b.load_state_dict(opt_a.state_dict())
    for step in range(2, 4):
        for ps in (a, b):
            for p, g in zip(ps, grads_for(ps, step)):
                p.grad = g
        opt_a.step()
        opt_b.step()
    assert_same_bits(a, b)


@needs_numba
def test_fused_steady_state_allocates_no_arrays():
    import tracemalloc
    ps = make_params(np.float32, shapes=[(200, 200)] * 3)  # 160 KB per array
    for p in ps:
        p.grad = np.ones_like(p.array)
    opt = optim.AdamW(ps, fused=True)
    opt.step()
    opt.step()
    tracemalloc.start()
    try:
        opt.step()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 32_000, f"a fused step allocated {peak} bytes; it must work in place"


# ----------------------------------------------------------------------------- against torch
def torch_run(torch, cls_name, kw, steps, params0):
    ps = [torch.nn.Parameter(torch.from_numpy(p.copy())) for p in params0]
    opt = getattr(torch.optim, cls_name)(ps, **kw)
    for step in range(steps):
        for p, g in zip(ps, grads_for([type("P", (), {"array": q})() for q in params0], step)):
            p.grad = torch.from_numpy(g)
        opt.step()
    return [p.detach().numpy() for p in ps]


@needs_numba
@pytest.mark.parametrize("cls,kw", ADAM_CASES + [(optim.SGD, c) for c in SGD_CASES])
@pytest.mark.parametrize("torch_path", ["foreach", "fused"])
def test_fused_matches_torch_after_10_steps(cls, kw, torch_path):
    torch = pytest.importorskip("torch")
    params0 = [p.array.copy() for p in make_params(np.float32)]
    ours = [Parameter(p.copy()) for p in params0]
    opt = cls(ours, fused=True, **kw)
    for step in range(10):
        for p, g in zip(ours, grads_for(ours, step)):
            p.grad = g
        opt.step()
    want = torch_run(torch, cls.__name__, dict(kw, **{torch_path: True}), 10, params0)
    for p, w in zip(ours, want):
        np.testing.assert_allclose(p.array, w, rtol=0, atol=1e-5)


# ----------------------------------------------------------------------------- flat parameters
def mlp(seed=0):
    from minidist import nn

    nn.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 8), nn.ReLU(),
                         nn.Linear(8, 3))


def train_steps(model, opt, steps=4, seed=0):
    from minidist import nn
    from minidist.tensor import Tensor

    rng = np.random.default_rng(seed)
    for _ in range(steps):
        x = Tensor(rng.standard_normal((5, 6)).astype(np.float32))
        y = Tensor(rng.integers(0, 3, 5))
        opt.zero_grad()
        nn.CrossEntropyLoss()(model(x), y).backward()
        opt.step()


@needs_numba
def test_flatten_parameters_one_call_per_step_same_bits(monkeypatch):
    plain, flat = mlp(), mlp()
    before = [p.array.copy() for p in flat.parameters()]
    (buffer,) = optim.flatten_parameters(flat.parameters())
    params = list(flat.parameters())
    assert buffer.size == sum(p.array.size for p in params)
    for p, b in zip(params, before):
        assert np.array_equal(p.array, b) and np.shares_memory(p.array, buffer)
    assert np.shares_memory(params[-1].array, buffer[:params[-1].array.size])  # reverse order
    counter = count_calls(monkeypatch)
    train_steps(plain, optim.AdamW(plain.parameters(), lr=1e-2, fused=True))
    calls_plain = len(counter.calls)
    train_steps(flat, optim.AdamW(flat.parameters(), lr=1e-2, fused=True))
    assert counter.calls[:calls_plain] == [buffer.size] * 4  # a multi-tensor call per step
    assert counter.calls[calls_plain:] == [buffer.size] * 4  # one flat call per step
    assert_same_bits(list(plain.parameters()), params)


@needs_numba
def test_flatten_parameters_under_ddp_one_call_per_bucket(group, monkeypatch):
    from minidist import comm
    from minidist.comm.transports.threads import run_threads
    from minidist.ddp import DistributedDataParallel

    counter = count_calls(monkeypatch)
    build = threading.Lock()

    def body(t, flatten):
        pg = comm.new_group_from_transport(t)
        with build:
            model = mlp()
            if flatten:
                optim.flatten_parameters(model.parameters())
        ddp = DistributedDataParallel(model, process_group=pg, bucket_cap_mb=0.0005,
                                      first_bucket_cap_mb=0.0002, overlap=False)
        opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=True)
        train_steps(ddp, opt, steps=3, seed=t.rank)
        ddp.close()
        return [p.array.copy() for p in model.parameters()], len(ddp.reducer.buckets)

    plain = run_threads(2, lambda t: body(t, False), timeout_s=60)
    counter.calls.clear()
    flat = run_threads(2, lambda t: body(t, True), timeout_s=60)
    buckets = flat[0][1]
    # ranks x steps: the buckets' runs go to one multi-tensor call
    assert 1 < buckets < 6 and len(counter.calls) == 2 * 3
    for (a, _), (b, _) in zip(plain, flat):
        for x, y in zip(a, b):
            assert np.array_equal(x, y)


@needs_numba
def test_options_the_kernels_lack_take_the_default_path(monkeypatch):
    """A group with an option the kernels do not implement (e.g. a future amsgrad) is updated
    by the optimizer's own rule, never by a kernel that would ignore the option."""
    counter = count_calls(monkeypatch)
    ps = make_params(np.float32)
    opt = optim.AdamW(ps, fused=True)
    opt.param_groups[0]["amsgrad"] = True
    calls = []
    monkeypatch.setattr(opt, "_update", lambda i, p, g: calls.append(i))
    for p, g in zip(ps, grads_for(ps, 0)):
        p.grad = g
    opt.step()
    assert counter.calls == [] and calls == list(range(len(ps)))


def test_amsgrad_with_fused_follows_the_reference_and_closure_returns_the_loss():
    """amsgrad is not a kernel option, so ``fused=True`` must take AdamW's own rule: checked
    against the independent NumPy reference (comparing with ``fused=False`` would compare the
    default path with itself)."""
    import optim_reference as ref

    a, b, opt_a, opt_b = run_pair(lambda ps, f: optim.AdamW(ps, amsgrad=True, fused=f),
                                  np.float64, steps=4)
    for k, p in enumerate(b):
        want, state = make_params(np.float64)[k].array, {}
        for step in range(4):
            want = ref.adamw(np.asarray(want), grads_for(b, step)[k], state, amsgrad=True)
        np.testing.assert_allclose(np.asarray(p.array), want, rtol=1e-9, atol=1e-12)
    assert "max_exp_avg_sq" in opt_b.state[0]
    for opt in (optim.SGD(b, lr=0.1, fused=True), opt_b):
        assert opt.step(lambda: 3.5) == 3.5


def test_a_kernel_that_fails_to_compile_falls_back_with_the_same_bits(monkeypatch):
    """Compiling or first launching fails (e.g. numba-cuda under a NumPy it does not know):
    one warning, nothing written by the failed rehearsal, the whole-array reference computes
    the step, and the results are the default path's bits."""
    from minidist.kernels.fallback import CompiledBackend, LoadState

    class Broken:
        def check_usable(self):
            pass

        def flat_step(self, *args):
            raise AttributeError("module 'numpy' has no attribute 'row_stack'")

        multi_step = flat_step

    backend = CompiledBackend("numba-cpu", "unused", "fix it")
    backend.module, backend.state = Broken(), LoadState.READY
    monkeypatch.setattr(fused, "_CPU", backend)
    with pytest.warns(RuntimeWarning, match="kernels cannot run here.*row_stack"):
        a, b, _, _ = run_pair(lambda ps, f: optim.AdamW(ps, fused=f), np.float32, steps=3)
    assert_same_bits(a, b)
    assert backend.get() is None


def mlp18(seed=0):
    """9 Linear layers: 18 parameter tensors, each its own allocation (not flattened)."""
    from minidist import nn

    nn.manual_seed(seed)
    layers = []
    for k in range(9):
        layers += [nn.Linear(6 if k == 0 else 12, 3 if k == 8 else 12), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


@needs_numba
@pytest.mark.parametrize("make", [
    lambda ps, f: optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=1e-3, fused=f),
    lambda ps, f: optim.SGD(ps, lr=0.05, fused=f),
    lambda ps, f: optim.AdamW(ps, lr=1e-2, fused=f),
    lambda ps, f: optim.Adam(ps, lr=1e-2, weight_decay=0.01, fused=f),
])
def test_unflattened_18_tensor_mlp_is_one_compiled_call_per_step(monkeypatch, make):
    """torch's multi-tensor apply: one call per (device, dtype) group per step over separate
    allocations, through a multi-tensor table, with the default path's bits."""
    plain, fast = mlp18(), mlp18()
    assert len(list(fast.parameters())) == 18
    counter = count_calls(monkeypatch)
    train_steps(plain, make(plain.parameters(), False), steps=4)
    assert counter.calls == []
    train_steps(fast, make(fast.parameters(), True), steps=4)
    numel = sum(p.array.size for p in fast.parameters())
    assert counter.calls == [numel] * 4  # at most two per step asked; one here (one dtype)
    assert_same_bits(list(plain.parameters()), list(fast.parameters()))


@needs_numba
def test_foreach_shares_the_multi_tensor_kernels(monkeypatch):
    plain, fast = mlp18(), mlp18()
    counter = count_calls(monkeypatch)
    train_steps(plain, optim.AdamW(plain.parameters(), lr=1e-2), steps=3)
    train_steps(fast, optim.AdamW(fast.parameters(), lr=1e-2, foreach=True), steps=3)
    assert counter.calls == [sum(p.array.size for p in fast.parameters())] * 3
    assert_same_bits(list(plain.parameters()), list(fast.parameters()))


@needs_numba
def test_two_dtypes_are_two_calls_per_step(monkeypatch):
    counter = count_calls(monkeypatch)
    ps = make_params(np.float32) + make_params(np.float64, seed=1)
    ref = make_params(np.float32) + make_params(np.float64, seed=1)
    opt, opt_ref = optim.AdamW(ps, fused=True), optim.AdamW(ref)
    for step in range(3):
        for p, r, g in zip(ps, ref, grads_for(ps, step)):
            p.grad, r.grad = g.copy(), g.copy()
        opt.step()
        opt_ref.step()
    assert len(counter.calls) == 2 * 3
    assert_same_bits(ps, ref)


# ----------------------------------------------------------------------------- a new fused step
# A new optimizer with a fused kernel, defined the way docs/layout.md's scenario (c) says: an
# element function, its registry entry, a class that names the entry. No kernel code: the
# Numba loops are built from the element function, and the default path runs the same
# function on whole arrays.
def rms_element(p, g, square_avg, lr, alpha, one_minus_alpha, eps, weight_decay):
    if weight_decay != 0:
        g = p * weight_decay + g
    square_avg = square_avg * alpha + (g * g) * one_minus_alpha
    return p - (g / (optim_math.sqrt(square_avg) + eps)) * lr, square_avg


def rms_scalars(group, step, first):
    return group["lr"], group["alpha"], 1.0 - group["alpha"], group["eps"], group["weight_decay"]


RMS_STEP = optim.register(optim.FusedStep("test_rms", rms_element, rms_scalars,
                                          state=("square_avg",)))


class PlainRMS(optim.Optimizer):
    """RMSprop without its options (centered, momentum): p -= lr * g / (sqrt(v) + eps)."""

    def __init__(self, params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0.0, *, fused=None):
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay,
                                      fused=fused))

    def fused_kernel(self, group):
        return RMS_STEP


from minidist.kernels import optim_math  # noqa: E402


@needs_numba
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kw", [dict(), dict(lr=3e-2, alpha=0.9, weight_decay=0.01)])
def test_a_new_fused_optimizer_is_its_element_and_entry(monkeypatch, kw, dtype):
    """fused=True runs compiled loops built from the element function alone, one call per
    step, with the default path's bits; state_dict has the entry's state names."""
    assert optim.FUSED_STEPS["test_rms"] is RMS_STEP
    counter = count_calls(monkeypatch)
    a, b, opt_a, opt_b = run_pair(lambda ps, f: PlainRMS(ps, fused=f, **kw), dtype, skip=3)
    updated = sum(p.array.size for step in range(6)
                  for p, g in zip(a, grads_for(a, step, skip=3)) if g is not None)
    assert sum(counter.calls) == updated  # every element by a compiled call: one per step,
    assert len(counter.calls) <= 6 + 2    # two when a parameter's first update joins in
    assert_same_bits(a, b)
    for i, s in opt_a.state_dict()["state"].items():
        assert list(s) == ["square_avg"]
        assert np.array_equal(s["square_avg"], opt_b.state[i]["square_avg"])
    want = make_params(dtype)[0].array.astype(np.float64)  # against the formula, in float64
    v = np.zeros_like(want)
    lr, alpha, eps, wd = kw.get("lr", 1e-2), kw.get("alpha", 0.99), 1e-8, kw.get("weight_decay", 0)
    for step in range(6):
        g = grads_for(a, step, skip=3)[0]
        if g is None:
            continue
        g = g.astype(np.float64) + wd * want
        v = alpha * v + (1 - alpha) * g * g
        want = want - lr * g / (np.sqrt(v) + eps)
    np.testing.assert_allclose(b[0].array, want, rtol=1e-4 if dtype == np.float32 else 1e-12)


def test_a_new_fused_optimizer_falls_back_to_its_element_on_whole_arrays(monkeypatch):
    """Kernels that fail to compile: the same element function on whole arrays, same bits."""
    from minidist.kernels.fallback import CompiledBackend, LoadState

    class Broken:
        def check_usable(self):
            pass

        def flat_step(self, *args):
            raise NotImplementedError("a build that compiles no fused step")  # its own warning

        multi_step = flat_step

    backend = CompiledBackend("numba-cpu", "unused", "fix it")
    backend.module, backend.state = Broken(), LoadState.READY
    monkeypatch.setattr(fused, "_CPU", backend)
    with pytest.warns(RuntimeWarning, match="kernels cannot run here"):
        a, b, _, _ = run_pair(lambda ps, f: PlainRMS(ps, fused=f), np.float32, steps=3)
    assert_same_bits(a, b)
