"""NaiveDataParallel (one all-reduce per gradient) is the oracle of DistributedDataParallel.

Both run over the threads transport: n ranks as n threads of this process, no MPI needed.
"""

import threading

import numpy as np
import pytest

from minidist import comm, nn
from minidist.comm.transports.threads import run_threads
from minidist.ddp import DistributedDataParallel, NaiveDataParallel
from minidist.tensor import Tensor

B = 4  # per-rank batch
BUILD = threading.Lock()  # thread ranks share nn.manual_seed's generator: build one at a time


def build():
    with BUILD:
        nn.manual_seed(0)
        return nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 3))


def data(n):
    rng = np.random.default_rng(1)
    return rng.normal(size=(n * B, 5)).astype(np.float32), rng.integers(0, 3, n * B)


def grads_of(n, wrap):
    x, y = data(n)

    def body(t):
        group = comm.new_group_from_transport(t)
        model = build()
        dp = wrap(model, group)
        sl = slice(t.rank * B, (t.rank + 1) * B)
        nn.CrossEntropyLoss()(dp(Tensor(x[sl])), Tensor(y[sl])).backward()
        if isinstance(dp, NaiveDataParallel):
            assert dp.all_reduce_gradients() == len(list(model.parameters()))
        else:
            dp.close()
        return [p.grad.array.copy() for p in model.parameters()]

    return run_threads(n, body, timeout_s=60)


@pytest.mark.parametrize("n,overlap", [(2, False), (3, True)])
def test_naive_equals_ddp_and_one_big_batch(group, n, overlap):
    naive = grads_of(n, lambda m, g: NaiveDataParallel(m, process_group=g))
    ddp = grads_of(n, lambda m, g: DistributedDataParallel(m, process_group=g,
                                                           bucket_cap_mb=0.001,
                                                           first_bucket_cap_mb=0.001,
                                                           overlap=overlap))
    # one process, batch n*B: the mean loss over n*B samples is the mean of the n rank means
    x, y = data(n)
    model = build()
    nn.CrossEntropyLoss()(model(Tensor(x)), Tensor(y)).backward()
    for r in range(n):
        for a, b, c in zip(naive[r], ddp[r], model.parameters()):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
            np.testing.assert_allclose(a, c.grad, rtol=1e-5, atol=1e-6)
        for a, b in zip(naive[r], naive[0]):  # every rank holds the same bits
            np.testing.assert_array_equal(a, b)
