"""Communicating layers checked on thread ranks against NumPy formulas that share no code with
them: SyncBatchNorm's running statistics (the variance unbiased over the GLOBAL batch; also
against torch's BatchNorm2d on the whole batch where torch is installed) and ZeRO-1's tail
(the last N mod n elements of a bucket) at n = 2 and 4."""

import numpy as np
import pytest

from minidist import comm
from minidist.comm.transports.threads import run_threads
from minidist.ddp import DistributedDataParallel, SyncBatchNorm, ZeroRedundancyOptimizer
from minidist.nn.module import Module, Parameter
from minidist.optim import SGD
from minidist.tensor import Tensor


def test_sync_batchnorm_running_stats_match_numpy(group):
    # Ranks with 2 and 3 samples of 2x2 pixels: 20 values per channel over the world, so an
    # unbiased variance (/19) and a biased one (/20) differ by 5%.
    c, momentum, steps = 3, 0.1, 2
    rng = np.random.default_rng(4)
    xs = [[rng.normal(size=(2 + r, c, 2, 2)) * 3 + 1 for r in range(2)] for _ in range(steps)]

    def body(t):
        bn = SyncBatchNorm(c, momentum=momentum,
                           process_group=comm.new_group_from_transport(t))
        for s in range(steps):
            bn(Tensor(xs[s][t.rank].astype(np.float32)))
        return bn.running_mean.array.copy(), bn.running_var.array.copy()

    mean, var = np.zeros(c), np.ones(c)
    for s in range(steps):
        values = np.concatenate([x.astype(np.float32).astype(np.float64).transpose(1, 0, 2, 3)
                                 .reshape(c, -1) for x in xs[s]], axis=1)
        mean = (1 - momentum) * mean + momentum * values.mean(axis=1)
        var = (1 - momentum) * var + momentum * values.var(axis=1, ddof=1)
    for got_mean, got_var in run_threads(2, body, timeout_s=60):
        np.testing.assert_allclose(got_mean, mean, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got_var, var, rtol=1e-5)


def test_sync_batchnorm_running_stats_match_torch_batchnorm_on_the_whole_batch(group):
    torch = pytest.importorskip("torch")
    c, rng = 3, np.random.default_rng(5)
    shards = [(rng.normal(size=(2 + r, c, 2, 2)) * 2 - 1).astype(np.float32) for r in range(2)]

    def body(t):
        bn = SyncBatchNorm(c, process_group=comm.new_group_from_transport(t))
        bn(Tensor(shards[t.rank]))
        return bn.running_mean.array.copy(), bn.running_var.array.copy()

    ref = torch.nn.BatchNorm2d(c)
    ref(torch.from_numpy(np.concatenate(shards)))
    for got_mean, got_var in run_threads(2, body, timeout_s=60):
        np.testing.assert_allclose(got_mean, ref.running_mean.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got_var, ref.running_var.numpy(), rtol=1e-5)


class Affine(Module):
    """out = x @ w + b + c: 9 + 3 + 1 = 13 elements in one bucket, so n = 2 and 4 leave a
    one-element tail."""

    def __init__(self):
        super().__init__()
        rng = np.random.default_rng(0)
        self.w = Parameter(rng.normal(size=(3, 3)))
        self.b = Parameter(rng.normal(size=3))
        self.c = Parameter(rng.normal(size=1))

    def forward(self, x):
        return x @ self.w + self.b + self.c


def numpy_grads(w, b, c, x, y):
    """d/d(w, b, c) of mean((x w + b + c - y)^2), by hand."""
    g = 2 * (x @ w + b + c - y) / y.size
    return x.T @ g, g.sum(axis=0), np.array([g.sum()])


@pytest.mark.parametrize("n", [2, 4])
def test_zero_tail_matches_sgd_in_numpy(group, n):
    lr, steps, rows = 0.1, 3, 2
    rng = np.random.default_rng(n)
    xs, ys = rng.normal(size=(steps, n * rows, 3)), rng.normal(size=(steps, n * rows, 3))

    def body(t):
        model = Affine()
        ddp = DistributedDataParallel(model, process_group=comm.new_group_from_transport(t),
                                      overlap=False)
        opt = ZeroRedundancyOptimizer(model.parameters(), SGD, ddp=ddp, lr=lr)
        mine = slice(t.rank * rows, (t.rank + 1) * rows)
        for s in range(steps):
            ((ddp(Tensor(xs[s, mine])) - Tensor(ys[s, mine])) ** 2).mean().backward()
            opt.step()
            opt.zero_grad()
        ddp.close()
        return [p.array.copy() for p in model.parameters()]

    ref = Affine()
    w, b, c = (p.array.copy() for p in ref.parameters())
    for s in range(steps):   # SGD on the average of the ranks' gradients
        per_rank = [numpy_grads(w, b, c, xs[s, r * rows:(r + 1) * rows],
                                ys[s, r * rows:(r + 1) * rows]) for r in range(n)]
        gw, gb, gc = (sum(g[k] for g in per_rank) / n for k in range(3))
        w, b, c = w - lr * gw, b - lr * gb, c - lr * gc
    for params in run_threads(n, body, timeout_s=60):
        for got, want in zip(params, (w, b, c)):
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
