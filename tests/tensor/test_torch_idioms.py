"""torch idioms from real scripts (nanoGPT, imagenet, Barlow Twins, word_language_model) run
unchanged: in-place arithmetic with torch's autograd rules, torch's math functions, tensor
methods, 0-d index tensors, dtype names, bfloat16. Each is checked against NumPy here and,
where torch is installed, against torch itself (those tests skip without it)."""

import numpy as np
import pytest

import minidist
from minidist import Tensor, nn

RNG = np.random.default_rng(0)


def arr(*shape):
    return RNG.normal(size=shape).astype(np.float32)


def torch_or_skip():
    return pytest.importorskip("torch")


# ---- in-place arithmetic ---------------------------------------------------------------------


def test_in_place_methods_update_the_same_array():
    a = arr(3, 4)
    t = Tensor(a.copy())
    data = t.array
    t.mul_(2.0).add_(Tensor(np.ones((3, 4), np.float32)), alpha=0.5).sub_(1.0, alpha=2.0)
    t.div_(4.0).pow_(2).clamp_(min=0.01, max=0.5)
    want = np.clip(((a * 2 + 0.5 - 2.0) / 4.0) ** 2, 0.01, 0.5)
    np.testing.assert_allclose(t.array, want, rtol=1e-6)
    assert t.array is data                                      # no new array: in place
    u, v = Tensor(arr(3, 4)), Tensor(np.abs(arr(3, 4)) + 1)
    base = Tensor(a.copy())
    base.addcmul_(u, v, value=0.5).addcdiv_(u, v, value=-2.0)
    np.testing.assert_allclose(base.array, a + 0.5 * u.array * v.array - 2.0 * u.array / v.array,
                               rtol=1e-5)
    assert base.dtype == minidist.float32


def test_out_of_place_alpha_forms():
    a, b = Tensor(arr(2, 3), requires_grad=True), Tensor(arr(2, 3))
    np.testing.assert_allclose(a.add(b, alpha=3.0).array, a.array + 3.0 * b.array, rtol=1e-6)
    np.testing.assert_allclose(a.sub(b, alpha=2).array, a.array - 2 * b.array, rtol=1e-6)
    np.testing.assert_allclose(a.mul(b).array, a.array * b.array)
    a.add(b, alpha=3.0).sum().backward()
    np.testing.assert_array_equal(a.grad, np.ones((2, 3), np.float32))


def test_in_place_on_a_leaf_that_requires_grad_raises_outside_no_grad():
    p = nn.Parameter(Tensor(arr(3)))
    with pytest.raises(RuntimeError, match="leaf tensor that requires grad.*no_grad"):
        p.add_(1.0)
    with minidist.no_grad():
        p.add_(Tensor(np.ones(3, np.float32)), alpha=-0.1)      # an optimizer's update
    assert p.requires_grad and p.is_leaf


def test_in_place_keeps_the_dtype_and_refuses_what_torch_refuses():
    counts = minidist.tensor([3, 4])
    counts.mul_(2)
    assert counts.dtype == minidist.int64 and counts.tolist() == [6, 8]
    with pytest.raises(RuntimeError, match="dtype"):
        counts.mul_(0.5)                                        # float into int64: torch too


def test_in_place_on_the_tape_is_recorded():
    # Barlow Twins' loss: c.div_(n); diagonal(c).add_(-1).pow_(2).sum() on tape tensors
    z1, z2 = arr(8, 4), arr(8, 4)
    a = Tensor(z1, requires_grad=True)
    c = a.T @ Tensor(z2)
    c.div_(8)
    on_diag = minidist.diagonal(c).add_(-1).pow_(2).sum()
    on_diag.backward()
    cm = z1.T @ z2 / 8
    np.testing.assert_allclose(on_diag.item(), ((np.diagonal(cm) - 1) ** 2).sum(), rtol=1e-5)
    gc = np.diag(2 * (np.diagonal(cm) - 1)) / 8
    np.testing.assert_allclose(a.grad, z2 @ gc.T, rtol=1e-5, atol=1e-6)


def test_in_place_methods_and_barlow_loss_against_torch():
    torch = torch_or_skip()
    z1, z2 = arr(8, 4), arr(8, 4)

    def off_diagonal(x):
        n, m = x.shape
        return x.flatten()[:-1].view(n - 1, n + 1)[:, 1:].flatten()

    grads = []
    for lib in (torch, minidist):
        a = lib.tensor(z1, requires_grad=True)
        c = a.T @ lib.tensor(z2)
        c.div_(8)
        loss = lib.diagonal(c).add_(-1).pow_(2).sum() + 0.005 * off_diagonal(c).pow_(2).sum()
        loss.backward()
        grads.append((loss.item(), np.asarray(a.grad)))
    np.testing.assert_allclose(grads[1][0], grads[0][0], rtol=1e-5)
    np.testing.assert_allclose(grads[1][1], grads[0][1], rtol=1e-4, atol=1e-6)
    x = arr(3, 4)
    for name, args, kwargs in [("add_", (x,), {"alpha": 0.5}), ("sub_", (x,), {"alpha": 2.0}),
                               ("mul_", (x,), {}), ("div_", (np.abs(x) + 1,), {}),
                               ("clamp_", (), {"min": -0.5, "max": 0.5}),
                               ("addcmul_", (x, x), {"value": 0.3}),
                               ("addcdiv_", (x, np.abs(x) + 1), {"value": -0.3})]:
        ref, mine = torch.tensor(x), minidist.tensor(x)
        getattr(ref, name)(*map(torch.tensor, args), **kwargs)
        getattr(mine, name)(*map(minidist.tensor, args), **kwargs)
        np.testing.assert_allclose(mine.numpy(), ref.numpy(), rtol=1e-6, err_msg=name)
    with pytest.raises(RuntimeError):
        torch.ones(2, requires_grad=True).add_(1)               # the rule we copy


# ---- functions -------------------------------------------------------------------------------


def test_log_and_trace_are_the_functions_and_the_modules_moved():
    x = Tensor(np.array([[1.0, 2.0], [3.0, 4.0]], np.float32), requires_grad=True)
    np.testing.assert_allclose(minidist.log(x).array, np.log(x.array))
    minidist.trace(x).backward()
    np.testing.assert_array_equal(x.grad, np.eye(2))
    from minidist.log import get_logger                        # the old paths still import
    from minidist.logger import rank_prefix
    from minidist.trace import merge
    from minidist.tracing import tracer
    assert callable(get_logger) and callable(merge) and rank_prefix() and tracer() is None


def test_functions_match_numpy():
    x = arr(3, 4)
    t = Tensor(x, requires_grad=True)
    np.testing.assert_allclose(minidist.sin(t).array, np.sin(x))
    np.testing.assert_allclose(minidist.cos(t).array, np.cos(x))
    np.testing.assert_allclose(minidist.exp(t).array, np.exp(x))
    np.testing.assert_allclose(minidist.softmax(t, dim=1).array.sum(1), np.ones(3), rtol=1e-6)
    np.testing.assert_allclose(minidist.norm(t).item(), np.linalg.norm(x), rtol=1e-6)
    np.testing.assert_allclose(minidist.norm(t, dim=1).array, np.linalg.norm(x, axis=1),
                               rtol=1e-6)
    np.testing.assert_allclose(minidist.norm(t, p=1).item(), np.abs(x).sum(), rtol=1e-6)
    w = minidist.where(t > 0, t, 0.0)
    assert w.dtype == minidist.float32
    np.testing.assert_array_equal(w.array, np.where(x > 0, x, 0))
    (w.sum() + minidist.norm(t)).backward()
    np.testing.assert_allclose(t.grad, (x > 0) + x / np.linalg.norm(x), rtol=1e-5)
    rows, cols = minidist.where(Tensor(x > 1))
    assert rows.dtype == minidist.int64 and list(zip(rows.tolist(), cols.tolist())) == \
        list(zip(*np.nonzero(x > 1)))
    zero = Tensor(np.zeros(3, np.float32), requires_grad=True)
    minidist.norm(zero).backward()
    assert np.all(zero.grad == 0)                              # torch: 0, not NaN, at 0


def test_functions_against_torch():
    torch = torch_or_skip()
    x = arr(4, 4)
    cases = [
        ("sin", lambda lib, t: lib.sin(t)), ("cos", lambda lib, t: lib.cos(t)),
        ("exp", lambda lib, t: lib.exp(t)), ("log", lambda lib, t: lib.log(t.abs() + 1)),
        ("softmax", lambda lib, t: lib.softmax(t, dim=-1)), ("trace", lambda lib, t: lib.trace(t)),
        ("norm", lambda lib, t: lib.norm(t)), ("norm1", lambda lib, t: lib.norm(t, p=1, dim=0)),
        ("where", lambda lib, t: lib.where(t > 0, t * 2, lib.ones_like(t))),
        ("diagonal", lambda lib, t: lib.diagonal(t, 1)),
        ("clamp", lambda lib, t: lib.clamp(t, -0.5, 0.5)), ("sqrt", lambda lib, t: (t * t).sqrt()),
        ("t", lambda lib, t: t.t() * lib.arange(4.0)),
        ("narrow", lambda lib, t: t.narrow(1, 1, 2)),
        ("expand_as", lambda lib, t: t[:1].expand_as(t) * t),
    ]
    for name, fn in cases:
        grads = []
        for lib in (torch, minidist):
            t = lib.tensor(x, requires_grad=True)
            out = fn(lib, t)
            (out * lib.tensor(np.linspace(0.5, 1.5, out.numel(), dtype=np.float32)
                              .reshape(tuple(out.shape)))).sum().backward()
            grads.append((out.detach().numpy(), t.grad.numpy() if lib is torch
                          else np.asarray(t.grad)))
        np.testing.assert_allclose(grads[1][0], grads[0][0], rtol=1e-5, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(grads[1][1], grads[0][1], rtol=1e-5, atol=1e-6, err_msg=name)


def test_diagonal_is_a_writable_view():
    x = Tensor(np.arange(9.0, dtype=np.float32).reshape(3, 3))
    minidist.diagonal(x).fill_(0)
    assert np.trace(x.array) == 0 and x.array[0, 1] == 1


# ---- tensor methods --------------------------------------------------------------------------


def test_new_factories_take_this_dtype_and_device():
    x = Tensor(np.ones((2, 3), np.float64))
    z = x.new_zeros((4, 5))
    assert z.shape == (4, 5) and z.dtype == minidist.float64 and z.device == x.device
    assert x.new_ones(2).array.tolist() == [1.0, 1.0]
    assert x.new_full((2,), 7).array.tolist() == [7.0, 7.0]
    assert x.new_empty(3, dtype=minidist.int64).dtype == minidist.int64
    assert x.new_zeros(2, requires_grad=True).requires_grad


def test_t_narrow_expand_as_type():
    x = Tensor(arr(2, 3))
    assert x.t().shape == (3, 2) and Tensor(arr(3)).t().shape == (3,)
    np.testing.assert_array_equal(x.narrow(1, 1, 2).array, x.array[:, 1:3])
    assert Tensor(arr(1, 3)).expand_as(x).shape == (2, 3)
    assert x.type() == "minidist.FloatTensor"
    assert x.type(minidist.float64).dtype == minidist.float64
    assert x.type(minidist.LongTensor).dtype == minidist.int64
    assert x.type("torch.DoubleTensor").dtype == minidist.float64
    with pytest.raises(IndexError):
        x.narrow(1, 2, 2)


def test_zero_dim_integer_tensor_is_an_index():
    # nanoGPT's get_batch: ix = torch.randint(len(data) - block_size, (batch_size,))
    data = np.arange(100, dtype=np.uint16)
    ix = minidist.randint(90, (4,))
    rows = [data[i:i + 8] for i in ix]
    assert all(r.tolist() == list(range(int(i), int(i) + 8)) for r, i in zip(rows, ix))
    x = minidist.stack([minidist.from_numpy(data[i:i + 8].astype(np.int64)) for i in ix])
    assert x.shape == (4, 8) and x.dtype == minidist.int64
    assert list(range(10))[minidist.tensor(3)] == 3
    with pytest.raises(TypeError, match="integer tensors of a single element"):
        data[minidist.tensor(1.5):]
    with pytest.raises(TypeError, match="single element"):
        data[minidist.tensor([1, 2]):]


def test_index_against_torch():
    torch = torch_or_skip()
    data = np.arange(50)
    i = torch.tensor(7)
    assert data[i:i + 3].tolist() == data[minidist.tensor(7):minidist.tensor(7) + 3].tolist()


# ---- dtypes ----------------------------------------------------------------------------------


def test_dtype_names_print_as_torch_and_compare_as_numpy():
    assert str(minidist.float32) == "minidist.float32" == repr(minidist.float)
    assert minidist.float32 == np.float32 and minidist.float32 == np.dtype("float32")
    assert minidist.float32 == "float32" and minidist.float32 != minidist.float64
    assert {np.dtype(np.float32): 1}[minidist.float32] == 1
    assert np.zeros(2, dtype=minidist.float16).dtype == np.float16
    assert minidist.zeros(2).dtype is minidist.float32
    assert minidist.float32.itemsize == 4 and minidist.float32.is_floating_point
    assert not minidist.int64.is_floating_point and minidist.bfloat16.is_floating_point
    assert isinstance(minidist.float32, minidist.dtype)


def test_dtype_repr_against_torch():
    torch = torch_or_skip()
    for name in ("float16", "bfloat16", "float32", "float64", "int32", "int64", "uint8", "bool"):
        assert str(getattr(torch, name)).replace("torch.", "minidist.") == \
            str(getattr(minidist, name)), name


def test_bfloat16_tensors_and_cpu_autocast():
    x = minidist.randn(2, 4)
    assert x.bfloat16().dtype == minidist.bfloat16 == x.to(minidist.bfloat16).dtype
    layer = nn.Linear(4, 3)
    with minidist.autocast("cpu", dtype=minidist.bfloat16):
        y = layer(x)
    assert y.dtype == minidist.bfloat16
    y.float().sum().backward()
    assert layer.weight.grad.dtype == np.float32
    np.testing.assert_allclose(np.asarray(y.float()), (x.array @ layer.weight.array.T
                                                       + layer.bias.array), rtol=2e-2, atol=2e-2)
    with pytest.raises(ValueError, match="bfloat16"):
        minidist.autocast("cuda", dtype=minidist.bfloat16)
    p = minidist.zeros(3, dtype=minidist.bfloat16, requires_grad=True)
    assert p.requires_grad


def test_legacy_constructors_are_refused_with_the_modern_spelling():
    with pytest.raises(TypeError, match=r"minidist.tensor\(data, dtype=minidist.int64\)"):
        minidist.LongTensor([1, 2])
    with pytest.raises(TypeError, match="minidist.zeros"):
        minidist.FloatTensor(3, 4)
    assert isinstance(minidist.arange(3), minidist.LongTensor)
    assert not isinstance(minidist.zeros(3), minidist.LongTensor)


# ---- an optimizer written with p.grad and in-place methods (Barlow Twins' LARS) -------------


def lars_step(lib, params, state, lr=0.1, weight_decay=1e-4, momentum=0.9, eta=0.001):
    """LARS as Barlow Twins writes it, over p.grad."""
    with lib.no_grad():
        for p in params:
            dp = p.grad
            if p.ndim != 1:
                dp = dp.add(p, alpha=weight_decay)
                param_norm = lib.norm(p)
                update_norm = lib.norm(dp)
                one = lib.ones_like(param_norm)
                q = lib.where(param_norm > 0.0,
                              lib.where(update_norm > 0, (eta * param_norm / update_norm), one),
                              one)
                dp = dp.mul(q)
            if id(p) not in state:
                state[id(p)] = lib.zeros_like(p)
            mu = state[id(p)]
            mu.mul_(momentum).add_(dp)
            p.add_(mu, alpha=-lr)


def test_lars_optimizer_matches_torch():
    torch = torch_or_skip()
    w0, b0 = arr(4, 3), arr(4)
    grads = [(arr(4, 3), arr(4)) for _ in range(3)]
    out = []
    for lib in (torch, minidist):
        w = lib.tensor(w0.copy(), requires_grad=True)
        b = lib.tensor(b0.copy(), requires_grad=True)
        state = {}
        for gw, gb in grads:
            w.grad, b.grad = lib.tensor(gw), lib.tensor(gb)
            lars_step(lib, [w, b], state)
        out.append((np.asarray(w.detach()), np.asarray(b.detach())))
    np.testing.assert_allclose(out[1][0], out[0][0], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(out[1][1], out[0][1], rtol=1e-5, atol=1e-7)


# ---- .data and .grad are Tensors ------------------------------------------------------------


def test_data_is_a_detached_tensor_sharing_the_array():
    layer = nn.Linear(4, 3)
    d = layer.weight.data
    assert isinstance(d, Tensor) and not d.requires_grad and d.is_leaf
    assert np.shares_memory(d.array, layer.weight.array)
    minidist.manual_seed(0)
    layer.weight.data.normal_(mean=0.0, std=0.02)           # minGPT's init
    layer.bias.data.zero_()
    assert abs(float(layer.weight.array.std()) - 0.02) < 0.02 and not layer.bias.array.any()
    layer.bias.data.fill_(1.0)
    assert layer.bias.array.tolist() == [1.0, 1.0, 1.0]
    layer.weight.data = minidist.zeros(3, 4)               # p.data = t: p holds t's array
    assert layer.weight.requires_grad and not layer.weight.array.any()
    with pytest.raises(TypeError, match="assign a Tensor"):
        layer.weight.data = [1.0, 2.0]


def test_grad_is_a_tensor_over_the_gradient_array():
    w = Tensor(np.ones((2, 3), np.float32), requires_grad=True)
    (w * 3.0).sum().backward()
    g = w.grad
    assert isinstance(g, Tensor) and g is w.grad and not g.requires_grad
    np.testing.assert_array_equal(g.array, np.full((2, 3), 3.0))
    (w * 1.0).sum().backward()                               # accumulates in the same array
    assert w.grad is g and g.array.tolist() == [[4.0] * 3] * 2
    w.grad.data.zero_()                                       # torch's in-place zeroing
    assert not w.grad.array.any()
    w.grad = Tensor(np.full((2, 3), 2.0, np.float32))       # p.grad = t
    assert w.grad.array.tolist() == [[2.0] * 3] * 2
    w.grad = None
    assert w.grad is None


def test_confusing_a_tensor_with_an_array_says_what_to_do():
    w = Tensor(np.ones(3, np.float32), requires_grad=True)
    w.sum().backward()
    with pytest.raises(AttributeError, match=r"\.data and \.grad are Tensors.*\.array"):
        w.grad.copy()
    with pytest.raises(TypeError, match=r"numpy.sign: got a Tensor.*t\.array"):
        np.sign(w.grad)
    assert np.sign(w.grad.array).tolist() == [1.0, 1.0, 1.0]
    np.testing.assert_array_equal(np.ones(3) * w.grad, np.ones(3))   # ndarray <op> Tensor works


def test_data_and_grad_types_match_torch():
    torch = torch_or_skip()
    for lib in (torch, minidist):
        layer = lib.nn.Linear(3, 2)
        layer(lib.ones(4, 3)).sum().backward()
        assert isinstance(layer.weight.data, lib.Tensor)
        assert isinstance(layer.weight.grad, lib.Tensor)
        assert not layer.weight.data.requires_grad and layer.weight.grad is layer.weight.grad
        before = np.array(layer.weight.detach().numpy())
        grad = np.array(layer.weight.grad.numpy())
        layer.weight.data.add_(layer.weight.grad, alpha=-0.5)   # word_language_model's step
        np.testing.assert_allclose(layer.weight.detach().numpy(), before - 0.5 * grad, rtol=1e-6)


def test_ddp_grads_are_tensors_over_the_bucket_views():
    from minidist import DistributedDataParallel as DDP
    minidist.init_process_group()
    try:
        model = DDP(nn.Linear(4, 2))
        model(minidist.ones(3, 4)).sum().backward()
        buffers = [b.buffer for b in model.buckets]
        for p in model.parameters():
            assert isinstance(p.grad, Tensor)
            assert any(np.shares_memory(p.grad.array, buf) for buf in buffers)   # no copy
        model.close()
    finally:
        minidist.destroy_process_group()
