"""torch's functions, layers and Tensor methods that ported scripts call, with torch's meaning
where NumPy's method of the same name differs: each op's gradient against finite differences
(float64), and with torch installed its values and gradients against torch's."""

import importlib
import logging

import numpy as np
import pytest

import minidist
import minidist.nn.functional as F
from minidist import nn, optim
from minidist.data import DataLoader, TensorDataset, random_split

RNG = np.random.default_rng(0)


def numeric_grad(f, x, eps=1e-6):
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        old = x[i]
        x[i] = old + eps
        hi = f()
        x[i] = old - eps
        lo = f()
        x[i] = old
        g[i] = (hi - lo) / (2 * eps)
    return g


def check_grads(fn, *arrays, atol=1e-6):
    """fn(*Tensors) -> Tensor; the gradient of sum(out * w) for a fixed random w, by finite
    differences, for every input."""
    out = fn(*[minidist.tensor(a) for a in arrays])
    w = RNG.normal(size=out.shape)

    def value():
        return float((fn(*[minidist.tensor(a) for a in arrays]).array * w).sum())

    ts = [minidist.tensor(a, requires_grad=True) for a in arrays]
    (fn(*ts) * minidist.tensor(w)).sum().backward()
    for a, t in zip(arrays, ts):
        np.testing.assert_allclose(t.grad.array, numeric_grad(value, a), atol=atol, rtol=1e-5)


def a(*shape):
    return RNG.normal(size=shape)


IDX = np.array([[0, 2, 2], [1, 0, 1]])
IDX_UNIQUE = np.array([[0, 3, 2], [1, 0, 3]])
IDX_MASK = np.array([[True, False, True], [False, False, True]])
OPS = {  # name -> (function of Tensors, input arrays); torch's spelling is the same
    "gather": (lambda x: x.gather(1, minidist.tensor(IDX)), [a(2, 4)]),
    "take": (lambda x: x.take(minidist.tensor(np.array([0, 5, 5, 7]))), [a(2, 4)]),
    "index_select": (lambda x: x.index_select(1, minidist.tensor(np.array([3, 0, 3]))),
                     [a(2, 4)]),
    "sort": (lambda x: x.sort(dim=1, descending=True).values, [a(3, 4)]),
    "repeat": (lambda x: x.repeat(2, 1, 3), [a(2, 3)]),
    "repeat_interleave": (lambda x: x.repeat_interleave(2, dim=0), [a(2, 3)]),
    "maximum": (lambda x, y: x.max(y), [a(3, 4), a(3, 4)]),
    "minimum": (lambda x, y: minidist.minimum(x, y), [a(3, 4), a(4)]),
    "std": (lambda x: x.std(), [a(3, 4)]),
    "var_dim": (lambda x: x.var(1, keepdim=True), [a(3, 4)]),
    "var_corr0": (lambda x: minidist.var(x, dim=0, correction=0), [a(3, 4)]),
    "cumsum": (lambda x: x.cumsum(1), [a(3, 4)]),
    "cumprod": (lambda x: x.cumprod(1), [a(3, 4)]),
    "cumprod_zero": (lambda x: x.cumprod(0), [np.array([[1.5, 0.0], [0.0, 2.0], [3.0, -1.0]])]),
    "prod": (lambda x: x.prod(1), [a(3, 4)]),
    "prod_zero": (lambda x: x.prod(), [np.array([2.0, 0.0, -3.0])]),
    "einsum_mm": (lambda x, y: minidist.einsum("nc,kc->nk", x, y), [a(2, 3), a(4, 3)]),
    "einsum_rowdot": (lambda x, y: minidist.einsum("nc,nc->n", [x, y]), [a(3, 2), a(3, 2)]),
    "einsum_ellipsis": (lambda x, y: minidist.einsum("...ij,jk->...ik", x, y),
                        [a(2, 3, 4), a(4, 2)]),
    "einsum_implicit": (lambda x: minidist.einsum("ij", x), [a(2, 3)]),
    "einsum_outer_sum": (lambda x, y: minidist.einsum("ij,k->k", x, y), [a(2, 3), a(4)]),
    "conv_transpose2d": (lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1,
                                                            output_padding=1),
                         [a(2, 3, 3, 4), a(3, 2, 3, 3), a(2)]),
    "leaky_relu": (lambda x: F.leaky_relu(x, 0.2), [a(3, 4)]),
    "normalize": (lambda x: F.normalize(x, dim=1), [a(3, 4)]),
    "bce": (lambda p, y: F.binary_cross_entropy(p, y, reduction="none"),
            [RNG.uniform(0.1, 0.9, (3, 4)), RNG.uniform(0, 1, (3, 4))]),
    "bce_logits": (lambda x, y: F.binary_cross_entropy_with_logits(
        x, y, pos_weight=minidist.tensor(np.array([0.5, 2.0, 1.0, 3.0]))),
        [a(3, 4), RNG.uniform(0, 1, (3, 4))]),
    "log1p": (lambda x: x.log1p(), [RNG.uniform(0.1, 2, (3, 4))]),
    "expm1": (lambda x: minidist.expm1(x), [a(3, 4)]),
    "flip": (lambda x: x.flip(1), [a(3, 4)]),
    "roll": (lambda x: minidist.roll(x, (1, -2), (0, 1)), [a(3, 4)]),
    "amax_ties": (lambda x: x.amax(1), [np.array([[1.0, 3.0, 3.0], [2.0, 0.5, -1.0]])]),
    "amin": (lambda x: minidist.amin(x, (0, 1), keepdim=True), [a(3, 4)]),
    "logsumexp": (lambda x: x.logsumexp(dim=1), [a(3, 4)]),
    "movedim": (lambda x: x.movedim(0, 2), [a(2, 3, 4)]),
    "outer": (lambda x, y: minidist.outer(x, y), [a(3), a(4)]),
    "tile": (lambda x: x.tile(2), [a(2, 3)]),
    "rsqrt": (lambda x: x.rsqrt(), [RNG.uniform(0.5, 2, (3, 4))]),
    "bmm": (lambda x, y: x.bmm(y), [a(2, 3, 4), a(2, 4, 2)]),
    "unbind": (lambda x: x.unbind(1)[2], [a(3, 4)]),
    "scatter": (lambda x, s: x.scatter(1, minidist.tensor(IDX_UNIQUE), s), [a(2, 4), a(2, 3)]),
    "scatter_repeated": (lambda x, s: x.scatter(1, minidist.tensor(IDX), s), [a(2, 4), a(2, 3)]),
    "scatter_add": (lambda x, s: x.scatter_add(1, minidist.tensor(IDX), s), [a(2, 4), a(2, 3)]),
    "index_add": (lambda x, s: x.index_add(0, minidist.tensor(np.array([2, 0, 2])), s,
                                           alpha=0.5), [a(3, 2), a(3, 2)]),
    "lerp": (lambda x, e: minidist.lerp(x, e, 0.3), [a(3, 4), a(3, 4)]),
    "diff": (lambda x: x.diff(n=2, dim=1), [a(3, 4)]),
    "median": (lambda x: x.median(1).values, [a(3, 5)]),
    "kthvalue": (lambda x: minidist.kthvalue(x, 2, 0).values, [a(3, 4)]),
    "masked_fill_on_tape": (lambda x: (x * 2).masked_fill_(minidist.tensor(IDX_MASK), 0.5),
                            [a(2, 3)]),
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_gradient_by_finite_differences(name):
    fn, arrays = OPS[name]
    check_grads(fn, *[x.copy() for x in arrays])


TORCH_SPELLING = {  # where torch's call differs from the minidist lambda above
    "minimum": lambda t, x, y: t.minimum(x, y),
    "einsum_rowdot": lambda t, x, y: t.einsum("nc,nc->n", [x, y]),
    "einsum_mm": lambda t, x, y: t.einsum("nc,kc->nk", x, y),
    "einsum_ellipsis": lambda t, x, y: t.einsum("...ij,jk->...ik", x, y),
    "einsum_implicit": lambda t, x: t.einsum("ij", x),
    "einsum_outer_sum": lambda t, x, y: t.einsum("ij,k->k", x, y),
    "var_corr0": lambda t, x: t.var(x, dim=0, correction=0),
    "expm1": lambda t, x: t.expm1(x),
    "roll": lambda t, x: t.roll(x, (1, -2), (0, 1)),
    "amin": lambda t, x: t.amin(x, (0, 1), keepdim=True),
    "outer": lambda t, x, y: t.outer(x, y),
    "scatter": lambda t, x, s: x.scatter(1, t.tensor(IDX_UNIQUE), s),
    "scatter_add": lambda t, x, s: x.scatter_add(1, t.tensor(IDX), s),
    "index_add": lambda t, x, s: x.index_add(0, t.tensor([2, 0, 2]), s, alpha=0.5),
    "lerp": lambda t, x, e: t.lerp(x, e, 0.3),
    "kthvalue": lambda t, x: t.kthvalue(x, 2, 0).values,
    "masked_fill_on_tape": lambda t, x: (x * 2).masked_fill_(t.tensor(IDX_MASK), 0.5),
    "gather": lambda t, x: x.gather(1, t.tensor(IDX)),
    "take": lambda t, x: x.take(t.tensor([0, 5, 5, 7])),
    "index_select": lambda t, x: x.index_select(1, t.tensor([3, 0, 3])),
    "conv_transpose2d": lambda t, x, w, b: t.nn.functional.conv_transpose2d(
        x, w, b, stride=2, padding=1, output_padding=1),
    "leaky_relu": lambda t, x: t.nn.functional.leaky_relu(x, 0.2),
    "normalize": lambda t, x: t.nn.functional.normalize(x, dim=1),
    "bce": lambda t, p, y: t.nn.functional.binary_cross_entropy(p, y, reduction="none"),
    "bce_logits": lambda t, x, y: t.nn.functional.binary_cross_entropy_with_logits(
        x, y, pos_weight=t.tensor([0.5, 2.0, 1.0, 3.0], dtype=t.float64)),
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_values_and_gradients_match_torch(name):
    torch = pytest.importorskip("torch")
    if name == "scatter_repeated":
        pytest.skip("repeated indices: torch gives every duplicate the gradient, minidist only "
                    "the write that wins (finite differences agree with minidist)")
    fn, arrays = OPS[name]
    tfn = TORCH_SPELLING.get(name)
    ours = [minidist.tensor(x.copy(), requires_grad=True) for x in arrays]
    theirs = [torch.tensor(x.copy(), requires_grad=True) for x in arrays]
    out = fn(*ours)
    tout = tfn(torch, *theirs) if tfn else fn(*theirs)
    np.testing.assert_allclose(out.array, tout.detach().numpy(), rtol=1e-10, atol=1e-12)
    w = RNG.normal(size=out.shape)
    (out * minidist.tensor(w)).sum().backward()
    (tout * torch.tensor(w)).sum().backward()
    for m, t in zip(ours, theirs):
        np.testing.assert_allclose(m.grad.array, t.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_numpy_namesakes_take_torchs_meaning():
    x = minidist.tensor(np.arange(5.0)[None])                     # shape (1, 5)
    assert x.repeat(4, 1).shape == (4, 5)                          # NumPy's repeat: (1, 20)
    assert x.array.repeat(4, 1).shape == (1, 20)
    v = minidist.tensor(np.array([1.0, 2.0, 3.0, 4.0]))
    assert float(v.std()) == pytest.approx(np.std([1, 2, 3, 4], ddof=1))   # torch: n - 1
    assert float(v.var(unbiased=False)) == pytest.approx(np.var([1, 2, 3, 4]))
    values, idx = minidist.tensor(np.array([[3.0, 1.0, 2.0]])).sort(dim=1)
    assert values.tolist() == [[1.0, 2.0, 3.0]] and idx.tolist() == [[1, 2, 0]]
    m = minidist.tensor(np.array([[1.0, 5.0], [7.0, 2.0]]))
    assert m.max(minidist.tensor(np.full((2, 2), 3.0))).tolist() == [[3.0, 5.0], [7.0, 3.0]]
    assert minidist.max(m, 1).indices.tolist() == [1, 0] and float(minidist.max(m)) == 7.0
    assert minidist.sum(m, dim=0).tolist() == [8.0, 7.0]
    assert m.nonzero().shape == (4, 2)                               # NumPy: a tuple
    assert m.take(minidist.tensor(np.array([3]))).tolist() == [2.0]     # flat, as torch
    assert m.mT.tolist() == [[1.0, 7.0], [5.0, 2.0]] and m.ravel().shape == (4,)
    assert m.argsort(dim=1, descending=True).tolist() == [[1, 0], [0, 1]]
    assert minidist.randperm(6, generator=minidist.Generator().manual_seed(1)).dtype == np.int64


def test_numpy_methods_that_differ_say_torchs_spelling_instead_of_dot_array():
    x = minidist.ones(2, 3)
    with pytest.raises(AttributeError, match=r"resize.*differs from torch.*reshape"):
        x.resize(3, 2)
    with pytest.raises(AttributeError, match=r"fill.*fill_"):
        x.fill(0)
    with pytest.raises(AttributeError, match=r"copy.*clone"):
        x.copy()
    with pytest.raises(AttributeError, match=r"tobytes.*no torch method.*\.array"):
        x.tobytes()


def test_numpy_namesakes_match_torch():
    torch = pytest.importorskip("torch")
    x = RNG.normal(size=(2, 3, 4))
    for lib, t in ((minidist, minidist.tensor(x)), (torch, torch.tensor(x))):
        got = [t[:1, :, :2].repeat(3, 1, 2), t.std(), t.var(1), t.std(dim=(0, 2)),
               t.sort(1).values, t.sort(1).indices, t.argsort(2, descending=True),
               t.view(-1, 4), t[:, :1].expand(2, 3, 4), t.flatten(1), t.max(2).values,
               t.min(1).indices, (t > 0).any(1), t.cumsum(2), t.prod(0), t.take(
                   lib.tensor([0, 23])), lib.max(t, t * 0.5), lib.sum(t, 1, keepdim=True),
               lib.mean(t, dim=2), lib.argmax(t, dim=1), t.round(decimals=1),
               t.repeat_interleave(2, dim=1), t.swapaxes(0, 2), t.mT, (t > 0).nonzero(),
               t.lt(0), t.ge(t * 0), t.isfinite(), (t > 0).logical_not(), t.floor(),
               t.amax((0, 2)), t.logsumexp(1), t.flip(0, 1), t.roll(1), t.unbind(2)[1],
               t.movedim((0, 1), (2, 0)), t.type_as(t.int()), t[0].mm(t[1].T),
               t.clamp_min(0.1), t.square(), t.tile((2, 1)), t.median(), t.median(1).values,
               t.median(2).indices, t.kthvalue(2, 2).indices, (t > 0).int().unique()]
        if lib is minidist:
            ours = got
        else:
            for i, (m, q) in enumerate(zip(ours, got)):
                np.testing.assert_allclose(np.asarray(m.array), q.numpy(), rtol=1e-12,
                                           err_msg=f"item {i}")


def test_layers_load_torchs_weights_and_match_its_outputs():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    for tl, ml in ((torch.nn.ConvTranspose2d(3, 2, 4, stride=2, padding=1),
                    nn.ConvTranspose2d(3, 2, 4, stride=2, padding=1)),
                   (torch.nn.LeakyReLU(0.2), nn.LeakyReLU(0.2))):
        ml.load_state_dict({k: v.numpy() for k, v in tl.state_dict().items()})
        x = RNG.normal(size=(2, 3, 5, 5)).astype(np.float32)
        np.testing.assert_allclose(ml(x).array, tl(torch.from_numpy(x)).detach().numpy(),
                                   rtol=1e-5, atol=1e-6)
    ct = nn.ConvTranspose2d(8, 4, 3, bias=True)
    bound = 1 / np.sqrt(4 * 9)                                       # torch's fan_in: out*k*k
    assert np.abs(ct.bias.array).max() <= bound and ct.weight.shape == (8, 4, 3, 3)
    p, y = RNG.uniform(0.01, 0.99, (6, 1)), (RNG.random((6, 1)) > 0.5).astype(np.float64)
    for tloss, mloss, inp in ((torch.nn.BCELoss(), nn.BCELoss(), p),
                              (torch.nn.BCEWithLogitsLoss(), nn.BCEWithLogitsLoss(), p - 0.5)):
        assert float(mloss(minidist.tensor(inp), minidist.tensor(y))) == pytest.approx(
            float(tloss(torch.tensor(inp), torch.tensor(y))), rel=1e-12)
    labels = np.array([0, 3, 1])
    assert F.one_hot(minidist.tensor(labels), 4).tolist() == torch.nn.functional.one_hot(
        torch.tensor(labels), 4).tolist()


def test_bce_refuses_logits_and_clamps_like_torch():
    with pytest.raises(RuntimeError, match="between 0 and 1"):
        F.binary_cross_entropy(minidist.tensor(np.array([1.5])), np.array([1.0]))
    p = minidist.tensor(np.array([0.0, 1.0]), requires_grad=True)
    loss = F.binary_cross_entropy(p, np.array([1.0, 0.0]))
    assert float(loss) == 100.0                                      # each log clamped at -100
    loss.backward()                                                  # torch's: / max(p(1-p), 1e-12)
    np.testing.assert_allclose(p.grad.array, [-0.5e12, 0.5e12])


def test_generator_seeds_randperm_randint_the_loader_and_random_split():
    g1, g2 = minidist.Generator().manual_seed(7), minidist.Generator().manual_seed(7)
    assert minidist.randperm(10, generator=g1).tolist() == minidist.randperm(
        10, generator=g2).tolist()
    assert minidist.randint(0, 100, (5,), generator=g1).tolist() == minidist.randint(
        0, 100, (5,), generator=g2).tolist()
    data = TensorDataset(minidist.arange(12))

    def orders(seed):
        g = minidist.Generator().manual_seed(seed)
        loader = DataLoader(data, batch_size=12, shuffle=True, generator=g)
        return [next(iter(loader))[0].tolist() for _ in range(2)]

    first = orders(3)
    assert first == orders(3) and first[0] != first[1]             # reproducible, new per pass
    a1, _ = random_split(data, [6, 6], generator=minidist.Generator().manual_seed(0))
    a2, _ = random_split(data, [6, 6], generator=minidist.Generator().manual_seed(0))
    assert list(a1.indices) == list(a2.indices)
    assert g1.initial_seed() == 7


def test_inference_mode_compile_matmul_precision_and_onnx(caplog):
    x = minidist.ones(2, requires_grad=True)
    with minidist.inference_mode():
        assert not (x * 2).requires_grad
    assert (x * 2).requires_grad

    @minidist.inference_mode()
    def f(t):
        return t * 2

    assert not f(x).requires_grad
    model = nn.Linear(2, 2)
    with caplog.at_level(logging.INFO, logger="minidist"):
        assert minidist.compile(model) is model
        assert minidist.compile(model, mode="max-autotune") is model
    assert sum("nothing is compiled" in r.getMessage() for r in caplog.records) <= 1
    minidist.set_float32_matmul_precision("high")
    assert minidist.get_float32_matmul_precision() == "high"
    with pytest.raises(ValueError, match="highest"):
        minidist.set_float32_matmul_precision("fast")
    minidist.set_float32_matmul_precision("highest")
    onnx = importlib.import_module("minidist.onnx")              # import minidist.onnx
    assert onnx is minidist.onnx and not onnx.is_in_onnx_export()
    with pytest.raises(NotImplementedError, match="cannot export to ONNX"):
        onnx.export(model, x, "m.onnx")


def test_one_cycle_lr_follows_torchs_rates_and_momentum():
    torch = pytest.importorskip("torch")
    cases = [(dict(max_lr=0.1, total_steps=20), "SGD", dict(momentum=0.9)),
             (dict(max_lr=0.1, epochs=2, steps_per_epoch=7, three_phase=True,
                   anneal_strategy="linear"), "AdamW", {})]
    for kw, name, okw in cases:
        topt = getattr(torch.optim, name)(torch.nn.Linear(2, 2).parameters(), lr=0.01, **okw)
        mopt = getattr(optim, name)(nn.Linear(2, 2).parameters(), lr=0.01, **okw)
        ts = torch.optim.lr_scheduler.OneCycleLR(topt, **kw)
        ms = optim.lr_scheduler.OneCycleLR(mopt, **kw)
        key = "momentum" if name == "SGD" else "betas"
        for _ in range(13):
            topt.step(), ts.step(), mopt.step(), ms.step()
            assert mopt.param_groups[0]["lr"] == pytest.approx(topt.param_groups[0]["lr"],
                                                               rel=1e-12)
            assert np.allclose(mopt.param_groups[0][key], topt.param_groups[0][key])


def test_one_cycle_lr_without_torch():
    opt = optim.SGD(nn.Linear(2, 2).parameters(), lr=1.0, momentum=0.9)
    sched = optim.lr_scheduler.OneCycleLR(opt, max_lr=1.0, total_steps=10, pct_start=0.5)
    lrs = [opt.param_groups[0]["lr"]]
    for _ in range(9):
        sched.step()
        lrs.append(opt.param_groups[0]["lr"])
    assert lrs[0] == pytest.approx(1 / 25) and max(lrs) == pytest.approx(1.0)
    assert lrs[-1] == pytest.approx(1 / 25 / 1e4) and opt.param_groups[0]["momentum"] == 0.95
    sched.step()
    with pytest.raises(ValueError, match="total_steps"):
        sched.step()


def test_gpu_spellings_answer_as_torch_does_on_this_machine():
    x = minidist.ones(2)
    assert x.is_xpu is False and x.is_pinned() is False
    assert minidist.distributed.get_default_backend_for_device("cpu") == "gloo"
    assert minidist.distributed.get_default_backend_for_device("cuda:0") == "nccl"
    assert minidist.cuda.is_bf16_supported() is False      # no bfloat16 on CuPy: pick float16
    if minidist.cuda.is_available():                        # torch's meaning with a GPU
        y = x.cuda(0, non_blocking=True).pin_memory()
        assert y.is_cuda and minidist.cuda.max_memory_allocated() >= y.nbytes
        minidist.cuda.reset_peak_memory_stats()
        minidist.cuda.empty_cache()
        return
    for query in (minidist.cuda.max_memory_allocated, minidist.cuda.memory_allocated,
                  minidist.cuda.max_memory_reserved, minidist.cuda.memory_reserved):
        assert query() == 0
    minidist.cuda.reset_peak_memory_stats(), minidist.cuda.empty_cache()
    with pytest.raises(minidist.DeviceUnavailableError):
        x.cuda(0, non_blocking=True)
    with pytest.raises(minidist.DeviceUnavailableError, match="pinned memory needs a GPU"):
        x.pin_memory()
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():                       # what a CPU-only torch answers
        assert torch.cuda.max_memory_allocated() == 0 and not torch.cuda.is_bf16_supported()
        with pytest.raises(RuntimeError):
            torch.ones(2).pin_memory()


def test_in_place_scatter_index_add_masked_fill_and_lerp_write_into_the_tensor():
    torch = pytest.importorskip("torch")
    for lib in (minidist, torch):
        z = lib.zeros(3, 4)
        view = z[0]
        z.scatter_(1, lib.tensor([[1], [0], [3]]), 1.0)           # a one-hot, in place
        z.index_add_(0, lib.tensor([0, 0]), lib.ones(2, 4))
        z.masked_fill_(z > 2, -1.0)
        ema = lib.full((4,), 2.0)
        ema.lerp_(lib.zeros(4), 0.25)                              # an EMA step
        got = (z.tolist(), view.tolist(), ema.tolist())
        if lib is minidist:
            ours = got
    assert ours == got
    w = minidist.ones(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf tensor that requires grad"):
        w.lerp_(minidist.zeros(3), 0.5)                            # torch refuses it too
    with minidist.no_grad():
        w.lerp_(minidist.zeros(3), 0.5)
    assert w.tolist() == [0.5, 0.5, 0.5]
