"""Bucket planning (reverse order, small first bucket, cap, dtype grouping) and grad views."""

import numpy as np
import pytest

from minidist.ddp.bucket import Bucket, BucketState, ParamMeta, plan_buckets
from minidist.tensor import Tensor

KiB = 1024


def metas(*specs):
    return [ParamMeta(f"p{i}", shape, dtype) for i, (shape, dtype) in enumerate(specs)]


def test_reverse_order_small_first_bucket_then_cap():
    # 6 float32 params of 1 KiB each; first bucket 1 KiB, cap 2 KiB.
    ps = metas(*[((256,), "float32")] * 6)
    plan = plan_buckets(ps, bucket_cap_bytes=2 * KiB, first_bucket_cap_bytes=1 * KiB)
    assert [b.param_indices for b in plan] == [[5], [4, 3], [2, 1], [0]]
    assert [b.offsets for b in plan] == [[0], [0, 256], [0, 256], [0]]
    assert sorted(i for b in plan for i in b.param_indices) == list(range(6))


def test_big_param_gets_its_own_bucket_and_is_never_split():
    ps = metas(((10,), "float32"), ((1000, 1000), "float32"), ((10,), "float32"))
    plan = plan_buckets(ps, bucket_cap_bytes=1 << 20, first_bucket_cap_bytes=1 << 20)
    assert [b.param_indices for b in plan] == [[2, 1], [0]]
    assert plan[0].offsets == [0, 16]  # 10 floats, then zeros up to the next cache line
    assert plan[0].numel == 1_000_016


def test_every_gradient_slot_starts_on_a_cache_line():
    ps = metas(((10,), "float32"), ((3, 7), "float32"), ((5,), "float64"), ((33,), "float16"),
               ((1,), "float64"), ((16,), "float32"), ((2, 2), "float16"))
    plan = plan_buckets(ps)
    for b in plan:
        itemsize = np.dtype(b.dtype).itemsize
        assert all(off * itemsize % 64 == 0 for off in b.offsets), (b.dtype, b.offsets)
        ends = [off + ps[i].numel for off, i in zip(b.offsets, b.param_indices)]
        assert all(end <= nxt for end, nxt in zip(ends, b.offsets[1:])), b.offsets  # disjoint
        assert b.numel == ends[-1]
        assert all(nxt - end < 64 // itemsize for end, nxt in zip(ends, b.offsets[1:]))


def test_dtypes_never_share_a_bucket():
    ps = metas(((4,), "float32"), ((4,), "float64"), ((4,), "float32"), ((4,), "float64"))
    plan = plan_buckets(ps)  # defaults: everything fits one bucket per dtype
    assert [(b.dtype, b.param_indices) for b in plan] == [("float64", [3, 1]),
                                                          ("float32", [2, 0])]


def test_default_caps_are_torchs():
    # 1.86M-param MLP 784-1024-1024-10 (float32): fc3 (41 KiB) + fc2 (4 MiB) -> first bucket
    # closes once it passes 1 MiB; the rest fits under 25 MiB.
    shapes = [(1024, 784), (1024,), (1024, 1024), (1024,), (10, 1024), (10,)]
    plan = plan_buckets(metas(*[(s, "float32") for s in shapes]))
    assert [b.param_indices for b in plan] == [[5, 4, 3, 2], [1, 0]]


def test_bad_cap_is_a_clear_error():
    with pytest.raises(ValueError, match="bucket_cap_mb > 0"):
        plan_buckets(metas(((4,), "float32")), bucket_cap_bytes=0)


def P(shape):  # a parameter: what a Bucket uses is its .array and .grad
    return Tensor(np.zeros(shape, np.float32), requires_grad=True)


def test_grads_are_views_and_reattach_keeps_values():
    params = [P((2, 3)), P((3,))]
    (spec,) = plan_buckets(metas(((2, 3), "float32"), ((3,), "float32")))
    b = Bucket(spec, params, ["w", "b"], np.full(spec.numel, 7, np.float32))
    assert b.attach_grads() == 2
    assert np.shares_memory(params[0].grad, b.buffer) and (b.buffer == 0).all()
    params[0].grad += 1                       # backward writes in place -> lands in the bucket
    assert spec.offsets == [0, 16]  # bias first (reverse order), the weight on the next line
    assert b.buffer[16:].sum() == 6 and b.buffer[:16].sum() == 0
    assert b.attach_grads() == 0              # views kept: accumulation not broken
    params[1].grad = None                     # zero_grad(set_to_none=True)
    params[0].grad = np.full((2, 3), 2, np.float32)   # user assigned an array
    assert b.attach_grads() == 2
    assert (b.buffer[:16] == 0).all() and (b.buffer[16:] == 2).all()
    b.reset()
    assert b.state is BucketState.EMPTY and not b.mark_slot_done(1) and b.state is BucketState.FILLING
    assert b.missing_names() == ["b"] and not b.mark_slot_done(1)   # a second report is ignored
    assert b.mark_slot_done(0) and b.state is BucketState.READY
