"""Tensor ops: values vs NumPy, gradients vs central finite differences (float64), dtypes, errors."""

import math

import numpy as np
import pytest

from minidist.tensor import (Tensor, cat, conv2d, cross_entropy, dropout, erf, layer_norm, linear,
                             log_softmax, max_pool2d, mse_loss, softmax, stack)

RNG = np.random.default_rng(1234)


def gradcheck(fn, *arrays, eps=1e-6, rtol=1e-5, atol=1e-6):
    """Compare backward() of sum(fn(*inputs) * R) with central differences, for every input."""
    inputs = [Tensor(a.astype(np.float64), requires_grad=True) for a in arrays]
    out = fn(*inputs)
    weights = RNG.standard_normal(out.shape)  # a random projection checks every output element
    (out * weights).sum().backward()

    def scalar(values):
        return float((fn(*[Tensor(v) for v in values]).array * weights).sum())

    values = [t.array.copy() for t in inputs]
    for k, t in enumerate(inputs):
        numeric = np.zeros_like(values[k])
        for i in np.ndindex(values[k].shape):
            old = values[k][i]
            values[k][i] = old + eps
            up = scalar(values)
            values[k][i] = old - eps
            down = scalar(values)
            values[k][i] = old
            numeric[i] = (up - down) / (2 * eps)
        assert t.grad is not None, f"input {k} got no gradient"
        np.testing.assert_allclose(t.grad, numeric, rtol=rtol, atol=atol,
                                   err_msg=f"gradient of input {k}")


def r(*shape):
    return RNG.standard_normal(shape)


def pos(*shape):
    return RNG.uniform(0.5, 2.0, shape)


# ---- element-wise, with broadcasting ------------------------------------------------------

BROADCAST = [((3, 1), (1, 4)), ((2, 3), (3,)), ((2, 3), ()), ((4,), (2, 3, 4)), ((2, 3), (2, 3))]


@pytest.mark.parametrize("sa,sb", BROADCAST)
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_binary_ops_broadcast(op, sa, sb):
    fns = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b,
           "mul": lambda a, b: a * b, "div": lambda a, b: a / b}
    a, b = r(*sa), pos(*sb)
    out = fns[op](Tensor(a), Tensor(b))
    np.testing.assert_allclose(out.array, fns[op](a, b))
    gradcheck(fns[op], a, b)


@pytest.mark.parametrize("fn", [
    lambda x: x + 2.5, lambda x: 2.5 + x, lambda x: x - 1.5, lambda x: 1.5 - x,
    lambda x: x * 3.0, lambda x: 3.0 * x, lambda x: x / 4.0, lambda x: 4.0 / x, lambda x: -x,
    lambda x: x ** 2, lambda x: x ** 3, lambda x: x ** 0.5, lambda x: x ** -1.5,
    lambda x: 2.0 ** x, lambda x: x.exp(), lambda x: x.log(), lambda x: x.tanh(),
    lambda x: x.sigmoid(), lambda x: (x - 1.2).relu(), lambda x: (x - 1.2).gelu(),
    lambda x: (x - 1.2).gelu("tanh"), lambda x: x + np.float64(2.0), lambda x: np.ones(3) * x,
])
def test_unary_and_scalar_ops(fn):
    gradcheck(fn, pos(2, 3))


def test_tensor_exponent():
    gradcheck(lambda a, b: a ** b, pos(2, 3), r(3))


def test_values_match_numpy():
    x = r(3, 4)
    t = Tensor(x)
    np.testing.assert_allclose(t.exp().array, np.exp(x))
    np.testing.assert_allclose(t.sigmoid().array, 1 / (1 + np.exp(-x)), rtol=1e-12)
    np.testing.assert_allclose(t.relu().array, np.maximum(x, 0))
    np.testing.assert_allclose(Tensor(np.array([-1000.0, 1000.0])).sigmoid().array, [0.0, 1.0])


def test_gelu_matches_exact_erf():
    x = np.linspace(-6, 6, 1001)
    exact = np.array([v * 0.5 * (1 + math.erf(v / math.sqrt(2))) for v in x])
    np.testing.assert_allclose(Tensor(x).gelu().array, exact, rtol=2.5e-7, atol=1e-300)
    np.testing.assert_allclose(erf(x), [math.erf(v) for v in x], atol=1.2e-7)
    x32 = x.astype(np.float32)
    assert Tensor(x32).gelu().dtype == np.float32
    tanh_form = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    np.testing.assert_allclose(Tensor(x).gelu("tanh").array, tanh_form)


# ---- reductions and shapes ----------------------------------------------------------------

@pytest.mark.parametrize("axis,keepdims", [(None, False), (0, False), (1, True), ((0, 2), False),
                                           (-1, True), ((0, 1, 2), True)])
def test_sum_mean(axis, keepdims):
    x = r(2, 3, 4)
    np.testing.assert_allclose(Tensor(x).sum(axis, keepdims).array, x.sum(axis, keepdims=keepdims))
    np.testing.assert_allclose(Tensor(x).mean(axis, keepdims).array,
                               x.mean(axis, keepdims=keepdims))
    gradcheck(lambda t: t.sum(axis, keepdims), x)
    gradcheck(lambda t: t.mean(axis, keepdims), x)


@pytest.mark.parametrize("axis,keepdims", [(None, False), (0, False), (1, True), (-1, False)])
def test_max_min(axis, keepdims):
    x = RNG.permutation(24).reshape(2, 3, 4).astype(np.float64)  # distinct: a clear winner
    np.testing.assert_allclose(Tensor(x).max(axis=axis, keepdims=keepdims).array,
                               x.max(axis, keepdims=keepdims))
    gradcheck(lambda t: t.max(axis=axis, keepdims=keepdims), x)
    gradcheck(lambda t: t.min(axis=axis, keepdims=keepdims), x)


def test_max_ties_send_the_gradient_to_one_winner():
    x = Tensor([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]], requires_grad=True)
    x.max(axis=1).sum().backward()
    np.testing.assert_array_equal(x.grad, [[0, 1, 0], [1, 0, 0]])


def test_shape_ops():
    x = r(2, 3, 4)
    gradcheck(lambda t: t.reshape(4, 6) * Tensor(np.arange(24.0).reshape(4, 6)), x)
    gradcheck(lambda t: t.reshape((3, -1)), x)
    gradcheck(lambda t: t.transpose(1, 2, 0), x)
    gradcheck(lambda t: t.transpose((2, 0, 1)), x)
    gradcheck(lambda t: t.T, x)
    gradcheck(lambda t: t.flatten(1), x)
    assert Tensor(x).transpose(1, 2, 0).shape == (3, 4, 2)
    assert Tensor(x).T.shape == (4, 3, 2)


@pytest.mark.parametrize("index", [
    (0,), (slice(1, None),), (Ellipsis, 1), (slice(None), [0, 2, 2]), ([1, 0, 1],),
    (np.array([[0, 1], [1, 1]]),), (slice(None), np.array([2, 0]), slice(1, 3)),
])
def test_getitem(index):
    x = r(2, 3, 4)
    index = index if len(index) > 1 else index[0]
    np.testing.assert_allclose(Tensor(x)[index].array, x[index])
    gradcheck(lambda t: t[index], x)


def test_getitem_boolean_mask_and_tensor_index():
    x = r(3, 4)
    mask = x > 0
    gradcheck(lambda t: t[mask], x)
    idx = Tensor(np.array([2, 2, 0]))
    gradcheck(lambda t: t[idx], x)


def test_cat_and_stack():
    a, b, c = r(2, 3), r(4, 3), r(2, 3)
    np.testing.assert_allclose(cat([Tensor(a), Tensor(b)]).array, np.concatenate([a, b]))
    gradcheck(lambda x, y: cat([x, y], axis=0), a, b)
    gradcheck(lambda x, y: cat([x, y], axis=1), a, c)
    gradcheck(lambda x, y: stack([x, y], axis=1), a, c)


# ---- matmul and linear --------------------------------------------------------------------

@pytest.mark.parametrize("sa,sb", [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((2, 3, 4), (2, 4, 5)),
                                   ((4,), (4, 5)), ((3, 4), (4,)), ((4,), (4,)),
                                   ((2, 1, 3, 4), (5, 4, 2))])
def test_matmul(sa, sb):
    a, b = r(*sa), r(*sb)
    np.testing.assert_allclose((Tensor(a) @ Tensor(b)).array, a @ b, rtol=1e-12)
    gradcheck(lambda x, y: x @ y, a, b)


def test_matmul_with_array_operands():
    a, b = r(3, 4), r(4, 2)
    gradcheck(lambda x: x @ b, a)
    gradcheck(lambda y: a @ y, b)


def test_linear():
    x, w, b = r(5, 4), r(3, 4), r(3)
    np.testing.assert_allclose(linear(Tensor(x), Tensor(w), Tensor(b)).array, x @ w.T + b)
    gradcheck(lambda x_, w_, b_: linear(x_, w_, b_), x, w, b)
    gradcheck(lambda x_, w_: linear(x_, w_), r(2, 5, 4), w)


# ---- softmax and losses -------------------------------------------------------------------

def test_softmax_log_softmax():
    x = r(3, 5)
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(softmax(Tensor(x)).array, e / e.sum(1, keepdims=True))
    np.testing.assert_allclose(log_softmax(Tensor(x)).array, np.log(e / e.sum(1, keepdims=True)))
    gradcheck(lambda t: softmax(t, axis=0), x)
    gradcheck(lambda t: log_softmax(t), x)
    gradcheck(lambda t: t.log_softmax(axis=0), x)
    big = Tensor(np.array([[1000.0, 0.0, -1000.0]], dtype=np.float32))
    assert np.isfinite(log_softmax(big).array).all() and np.isfinite(softmax(big).array).all()


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy(reduction):
    x, t = r(6, 4), RNG.integers(0, 4, 6)
    logp = x - np.log(np.exp(x).sum(1, keepdims=True))
    per = -logp[np.arange(6), t]
    want = {"mean": per.mean(), "sum": per.sum(), "none": per}[reduction]
    np.testing.assert_allclose(cross_entropy(Tensor(x), t, reduction=reduction).array, want, rtol=1e-12)
    gradcheck(lambda z: cross_entropy(z, t, reduction=reduction), x)


def test_cross_entropy_is_stable_and_keeps_dtype():
    x = Tensor(np.array([[1e4, 0.0], [0.0, -1e4]], dtype=np.float32), requires_grad=True)
    loss = cross_entropy(x, [0, 1])
    assert loss.dtype == np.float32 and np.isfinite(loss.item())
    loss.backward()
    assert x.grad.dtype == np.float32 and np.isfinite(x.grad.array).all()


def test_mse_loss():
    a, b = r(3, 2), r(3, 2)
    np.testing.assert_allclose(mse_loss(Tensor(a), Tensor(b)).array, ((a - b) ** 2).mean())
    gradcheck(lambda x, y: mse_loss(x, y), a, b)
    gradcheck(lambda x: mse_loss(x, b, "sum"), a)


def test_layer_norm():
    x, w, b = r(4, 5), r(5), r(5)
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    want = (x - mu) / np.sqrt(var + 1e-5) * w + b
    np.testing.assert_allclose(layer_norm(Tensor(x), (5,), Tensor(w), Tensor(b)).array, want,
                               rtol=1e-10)
    gradcheck(lambda x_, w_, b_: layer_norm(x_, (5,), w_, b_), x, w, b, rtol=1e-4)


def test_dropout():
    x = Tensor(np.ones((200, 50)), requires_grad=True)
    out = dropout(x, 0.3, training=True, generator=np.random.default_rng(0))
    kept = out.array != 0
    assert 0.65 < kept.mean() < 0.75
    np.testing.assert_allclose(out.array[kept], 1 / 0.7)
    out.sum().backward()
    np.testing.assert_allclose(x.grad, out.array)  # gradient = mask / (1 - p)
    assert dropout(x, 0.3, training=False) is x


# ---- convolution --------------------------------------------------------------------------

def direct_conv(x, w, b, stride, pad):
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp_ = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    ho, wo = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
    out = np.zeros((n, o, ho, wo))
    for i in range(n):
        for k in range(o):
            for y in range(ho):
                for z in range(wo):
                    patch = xp_[i, :, y * stride:y * stride + kh, z * stride:z * stride + kw]
                    out[i, k, y, z] = (patch * w[k]).sum() + b[k]
    return out


@pytest.mark.parametrize("stride,pad", [(1, 0), (1, 1), (2, 1), (2, 0)])
def test_conv2d(stride, pad):
    x, w, b = r(2, 3, 5, 6), r(4, 3, 3, 2), r(4)
    out = conv2d(Tensor(x), Tensor(w), Tensor(b), stride, pad)
    np.testing.assert_allclose(out.array, direct_conv(x, w, b, stride, pad), rtol=1e-10)
    gradcheck(lambda x_, w_, b_: conv2d(x_, w_, b_, stride, pad), x, w, b)


@pytest.mark.parametrize("k,s", [(2, None), (3, 1), (2, 1), (3, 2)])
def test_max_pool2d(k, s):
    x = RNG.permutation(2 * 3 * 7 * 6).reshape(2, 3, 7, 6).astype(np.float64)
    st = s or k
    ho, wo = (7 - k) // st + 1, (6 - k) // st + 1
    want = np.array([[[[x[n, c, i * st:i * st + k, j * st:j * st + k].max() for j in range(wo)]
                       for i in range(ho)] for c in range(3)] for n in range(2)])
    np.testing.assert_array_equal(max_pool2d(Tensor(x), k, s).array, want)
    gradcheck(lambda t: max_pool2d(t, k, s), x)


# ---- dtypes -------------------------------------------------------------------------------

def test_default_dtypes():
    assert Tensor(1.0).dtype == np.float32
    assert Tensor([[1.0, 2.0]]).dtype == np.float32
    assert Tensor([1, 2]).dtype == np.int64
    assert Tensor(np.zeros(2)).dtype == np.float64  # explicit arrays keep their dtype
    a = np.zeros(3, dtype=np.float32)
    assert Tensor(a).array is a  # no copy


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_dtype_is_carried_through(dtype):
    x = Tensor(r(4, 3).astype(dtype), requires_grad=True)
    w = Tensor(r(5, 3).astype(dtype), requires_grad=True)
    outs = [x + 1.0, 2.0 * x, x / 3, 1 - x, x ** 2, x.exp(), x.tanh(), x.sigmoid(), x.relu(),
            x.gelu(), x.gelu("tanh"), x * np.float64(2.0), x + np.ones(3), x.sum(0), x.mean(),
            x.max(axis=1), x.max(1).values, x @ w.T, linear(x, w), softmax(x), log_softmax(x), x[[0, 1]], x.T,
            cat([x, x]), layer_norm(x, (3,)), mse_loss(x, np.zeros((4, 3))),
            cross_entropy(x, [0, 1, 2, 0])]
    for i, out in enumerate(outs):
        assert out.dtype == dtype, f"op #{i} returned {out.dtype}"
    loss = sum((o.sum() for o in outs), Tensor(np.zeros((), dtype=dtype)))
    assert loss.dtype == dtype
    loss.backward()
    assert x.grad.dtype == dtype and w.grad.dtype == dtype


def test_astype_is_differentiable():
    x = Tensor(r(3).astype(np.float16), requires_grad=True)
    y = x.float()
    assert y.dtype == np.float32 and x.half() is x
    (y * 2).sum().backward()
    assert x.grad.dtype == np.float16
    np.testing.assert_allclose(x.grad, 2)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_conv_and_pool_keep_dtype(dtype):
    x = Tensor(r(2, 1, 8, 8).astype(dtype), requires_grad=True)
    w = Tensor(r(4, 1, 3, 3).astype(dtype), requires_grad=True)
    b = Tensor(r(4).astype(dtype), requires_grad=True)
    out = max_pool2d(conv2d(x, w, b, 1, 1), 2)
    assert out.dtype == dtype and out.shape == (2, 4, 4, 4)
    out.sum().backward()
    assert x.grad.dtype == w.grad.dtype == b.grad.dtype == dtype


# ---- errors -------------------------------------------------------------------------------

def test_matmul_error_names_both_shapes():
    with pytest.raises(ValueError, match=r"matmul: shapes \(3, 4\) and \(5, 2\) are not aligned: "
                                         r"4 \(dim 1 of the left\) != 5 \(dim 0 of the right\)"):
        Tensor(np.zeros((3, 4))) @ Tensor(np.zeros((5, 2)))


def test_broadcast_error_names_the_op_and_shapes():
    with pytest.raises(ValueError, match=r"add: shapes \(3, 4\) and \(5,\) cannot be broadcast"):
        Tensor(np.zeros((3, 4))) + Tensor(np.zeros(5))
    with pytest.raises(ValueError, match=r"mul: shapes \(2, 3\) and \(4, 3\).*dim -2 is 2"):
        Tensor(np.zeros((2, 3))) * Tensor(np.zeros((4, 3)))


def test_other_errors():
    with pytest.raises(ValueError, match=r"linear: input of shape \(2, 5\) has 5 features"):
        linear(Tensor(np.zeros((2, 5))), Tensor(np.zeros((3, 4))))
    with pytest.raises(ValueError, match=r"target holds class 7, outside \[0, 3\)"):
        cross_entropy(Tensor(np.zeros((2, 3))), [0, 7])
    with pytest.raises(ValueError, match=r"target has shape \(3,\)"):
        cross_entropy(Tensor(np.zeros((2, 3))), [0, 1, 2])
    with pytest.raises(ValueError, match="float target holds class probabilities"):
        cross_entropy(Tensor(np.zeros((2, 3))), np.array([0.0, 1.0]))
    with pytest.raises(TypeError, match="only float tensors can require grad"):
        Tensor([1, 2], requires_grad=True)
    with pytest.raises(ValueError, match=r"cannot reshape a tensor of shape \(2, 3\)"):
        Tensor(np.zeros((2, 3))).reshape(4, 2)
    with pytest.raises(ValueError, match=r"conv2d: input of shape \(1, 2, 5, 5\) has 2 channels"):
        conv2d(Tensor(np.zeros((1, 2, 5, 5))), Tensor(np.zeros((4, 3, 3, 3))))
    with pytest.raises(ValueError, match=r"mse_loss: input shape \(3,\) and target shape \(3, 1\)"):
        mse_loss(Tensor(np.zeros(3)), np.zeros((3, 1)))
