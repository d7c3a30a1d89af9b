"""DDP's cheap per-step paths: lazy bucket attach, the dot-product NaN check, overlap="auto"."""

import numpy as np
import pytest

from minidist import nn
from minidist.ddp import DistributedDataParallel, auto_overlap
from minidist.ddp.bucket import Bucket, ParamMeta, plan_buckets
from minidist.ddp.reducer import all_finite_fast
from minidist.tensor import Tensor


class P:
    def __init__(self, shape):
        self.data = np.zeros(shape, np.float32)
        self.grad = None


def test_attach_without_zeroing_leaves_none_grads_alone():
    params = [P((2, 3)), P((3,))]
    (spec,) = plan_buckets([ParamMeta("w", (2, 3), "float32"), ParamMeta("b", (3,), "float32")])
    b = Bucket(spec, params, ["w", "b"], np.full(spec.numel, 7, np.float32))
    params[0].grad = np.ones((2, 3), np.float32)          # a user-assigned grad is still kept
    assert b.attach_grads(zero_missing=False) == 1
    assert params[1].grad is None and (b.buffer[3:] == 1).all() and (b.buffer[:3] == 7).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_all_finite_fast(dtype):
    x = np.random.default_rng(0).normal(size=1000).astype(dtype)
    assert all_finite_fast(x)
    for bad in (np.nan, np.inf, -np.inf):
        y = x.copy()
        y[517] = bad
        assert not all_finite_fast(y)
    assert all_finite_fast(np.arange(5))                  # integers are always finite


def test_huge_finite_grads_are_not_reported(group, caplog):
    nn.manual_seed(0)
    m = nn.Linear(3, 2)
    ddp = DistributedDataParallel(m, nonfinite_grads="raise")
    x = np.full((2, 3), 1e20, np.float32)                 # dot overflows, values are finite
    (ddp(Tensor(x)).sum()).backward()                     # exact search finds nothing: no raise
    assert np.isfinite(m.weight.grad).all() and not all_finite_fast(ddp.buckets[0].buffer)
    ddp.close()


def test_grads_stay_none_until_backward_then_are_bucket_views(group):
    nn.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    ddp = DistributedDataParallel(m)
    x = Tensor(np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32))
    for _ in range(2):
        m.zero_grad()
        out = ddp(x)
        assert all(p.grad is None for p in m.parameters())   # no memset at forward
        (out ** 2).mean().backward()
        assert all(any(np.shares_memory(p.grad, b.buffer) for b in ddp.buckets)
                   for p in m.parameters())
    ddp.close()


def test_auto_overlap_is_off_only_at_about_one_core_per_rank():
    assert auto_overlap(1, cpus=64) is False              # nothing to overlap with
    assert auto_overlap(2, cpus=2, env={}) is False       # 2 ranks, 2 cores: no spare core
    assert auto_overlap(2, cpus=3, env={}) is False
    assert auto_overlap(2, cpus=4, env={}) is True        # a spare core per rank
    assert auto_overlap(4, cpus=2, env={}) is True        # oversubscribed: hides peer waits
    assert auto_overlap(8, cpus=4, env={"LOCAL_WORLD_SIZE": "2"}) is True   # 4 nodes x 2
    assert auto_overlap(8, cpus=4, env={"MPI_LOCALNRANKS": "4"}) is False


def test_bad_overlap_value(group):
    with pytest.raises(ValueError, match="overlap='yes'"):
        DistributedDataParallel(nn.Linear(2, 2), overlap="yes")
