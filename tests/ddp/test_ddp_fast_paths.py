"""DDP's cheap per-step paths: lazy bucket attach, the dot-product NaN check, overlap="auto",
zero-copy backward (gradients written straight into their bucket slots, already averaged)."""

import threading
import tracemalloc

import numpy as np
import pytest

from minidist import comm, nn
from minidist.comm.transports.threads import run_threads
from minidist.ddp import DistributedDataParallel, auto_overlap
from minidist.comm.transports.local import LocalTransport
from minidist.ddp.bucket import Bucket, ParamMeta, plan_buckets
from minidist.ddp.options import first_bucket_cap
from minidist.watch.nonfinite import all_finite_fast
from minidist.ddp.reducer import Reducer
from minidist.tensor import Tensor


BUILD = threading.Lock()


def P(shape):  # a parameter: what a Bucket uses is its .array and .grad
    return Tensor(np.zeros(shape, np.float32), requires_grad=True)


def test_attach_without_zeroing_leaves_none_grads_alone():
    params = [P((2, 3)), P((3,))]
    (spec,) = plan_buckets([ParamMeta("w", (2, 3), "float32"), ParamMeta("b", (3,), "float32")])
    b = Bucket(spec, params, ["w", "b"], np.full(spec.numel, 7, np.float32))
    params[0].grad = np.ones((2, 3), np.float32)          # a user-assigned grad is still kept
    assert b.attach_grads(zero_missing=False) == 1
    w, bias = b.views[1], b.views[0]  # (reverse order: the bias's slot first)
    assert params[1].grad is None and (w == 1).all() and (bias == 7).all()


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
    assert np.isfinite(m.weight.grad.array).all() and not all_finite_fast(ddp.buckets[0].buffer)
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


def test_without_overlap_on_any_rank_the_first_bucket_is_a_full_one():
    # 784 KiB + 2 MiB of float32 gradients: with overlap, a small first bucket (the last
    # layer, 1 MiB cap) starts the reduction early; with no rank overlapping it would only add
    # a collective, so the first bucket takes bucket_cap_mb too. The ranks agree: one rank that
    # overlaps keeps the small first bucket for all (the plan must be the same everywhere).
    def model():
        with BUILD:
            nn.manual_seed(0)
            return nn.Sequential(nn.Linear(196, 1024), nn.ReLU(), nn.Linear(1024, 512))

    def buckets(overlaps):
        def body(t):
            # the group's default ("shm") cannot run on thread ranks: the agreement asks "auto"
            group = comm.new_group_from_transport(t, algorithm="shm")
            ddp = DistributedDataParallel(model(), process_group=group, algorithm="ring",
                                          overlap=overlaps[t.rank])
            sizes = [b.spec.numel for b in ddp.buckets]
            ddp.close()
            return sizes
        return run_threads(2, body, timeout_s=60)

    try:
        one = [196 * 1024 + 1024 + 1024 * 512 + 512]
        assert buckets([False, False]) == [one, one]
        small_first = buckets([True, True])
        assert small_first[0] == small_first[1] and len(small_first[0]) == 2
        assert buckets([True, False]) == small_first  # agreed: the same plan on both ranks
    finally:
        if comm.is_initialized():  # DDP made a default group beside the threads' groups
            comm.destroy_process_group()
    assert first_bucket_cap(1, 25, False, comm.ProcessGroup(LocalTransport())) == 25
    assert first_bucket_cap(1, 25, True, comm.ProcessGroup(LocalTransport())) == 1
    assert first_bucket_cap(40, 25, False, comm.ProcessGroup(LocalTransport())) == 40


def test_bad_overlap_value(group):
    with pytest.raises(ValueError, match="overlap='yes'"):
        DistributedDataParallel(nn.Linear(2, 2), overlap="yes")


# ---- zero-copy backward: each gradient is written straight into its bucket slot ----------

def big_mlp():
    nn.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 4))


def backward_peak_bytes(run):
    tracemalloc.start()
    try:
        run()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_ddp_backward_writes_grads_into_the_buckets_without_allocating_them(group):
    m = big_mlp()
    ddp = DistributedDataParallel(m)
    x = Tensor(np.random.default_rng(0).normal(size=(2, 256)).astype(np.float32))
    for _ in range(2):                          # the second step starts from set_to_none grads
        m.zero_grad()
        loss = (ddp(x) ** 2).mean()
        peak = backward_peak_bytes(loss.backward)
        slots = {id(v) for b in ddp.buckets for v in b.views}
        assert all(id(p.grad.array) in slots for p in m.parameters())
        # fc1.weight's gradient alone is 512 KiB: allocating it and copying it in would show
        assert peak < m[0].weight.array.nbytes // 4, peak
    ref = big_mlp()
    (ref(x) ** 2).mean().backward()
    for p, q in zip(m.parameters(), ref.parameters()):
        np.testing.assert_allclose(p.grad, q.grad, rtol=1e-5, atol=1e-7)
    ddp.close()
    assert all(p.grad_destination is None for p in m.parameters())   # released with the hooks


class RecordingGroup:
    """A group whose "all-reduce" records the call and leaves the buffer as it is: what a SUM
    gives when every peer contributed zeros."""

    def __init__(self, size, calls):
        self.size, self.calls = size, calls

    def all_reduce(self, array, op="sum", algorithm=None, label=None):
        self.calls.append(op)


def reducer_for(params, world_size, reduce_calls):
    names = [f"p{i}" for i in range(len(params))]
    specs = plan_buckets([ParamMeta(n, p.array.shape, str(p.array.dtype))
                          for n, p in zip(names, params)])
    group = RecordingGroup(world_size, reduce_calls)
    buckets = [Bucket(s, params, names, np.zeros(s.numel, s.dtype), group) for s in specs]
    return Reducer(params, names, buckets, overlap=False)


def test_synced_step_writes_grad_over_n_into_the_slot_and_resets_after():
    from minidist.ddp.hooks import prescaled_allreduce_hook
    m, ref = big_mlp(), big_mlp()
    params = list(m.parameters())
    calls = []
    reducer = reducer_for(params, 2, calls)
    reducer.comm_hook = prescaled_allreduce_hook
    x = Tensor(np.random.default_rng(0).normal(size=(2, 256)).astype(np.float32))
    (ref(x) ** 2).mean().backward()
    for p in params:
        p.grad = None
    reducer.prepare_for_forward()
    loss = (m(x) ** 2).mean()
    peak = backward_peak_bytes(loss.backward)
    assert calls == ["sum"] * len(reducer.buckets)      # the average was folded in: a SUM
    assert peak < m[0].weight.array.nbytes // 4, peak    # grad / n written, not copied in
    for p, q in zip(params, ref.parameters()):
        np.testing.assert_allclose(p.grad, q.grad / 2, rtol=1e-6, atol=1e-8)
    # no_sync-style accumulation (no prepare): a later backward adds the full gradient
    (m(x) ** 2).mean().backward()
    for p, q in zip(params, ref.parameters()):
        np.testing.assert_allclose(p.grad, 1.5 * q.grad, rtol=1e-5, atol=1e-8)
    # a synced step over an accumulated slot divides the whole sum by n when it is ready
    reducer.prepare_for_forward()
    (m(x) ** 2).mean().backward()
    for p, q in zip(params, ref.parameters()):
        np.testing.assert_allclose(p.grad, 2.5 * q.grad / 2, rtol=1e-5, atol=1e-8)
    reducer.close()


def conv_net():
    with BUILD:  # thread ranks share nn.manual_seed's generator: build one at a time
        nn.manual_seed(0)
        return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(), nn.Flatten(),
                             nn.Linear(4 * 5 * 5, 3))


def test_conv_model_over_two_thread_ranks_matches_one_big_batch(group):
    # conv2d writes its weight and bias gradients into the bucket slots, times 1/2
    x = np.random.default_rng(1).normal(size=(4, 2, 5, 5)).astype(np.float32)
    y = np.random.default_rng(2).integers(0, 3, 4)

    def body(t):
        model = conv_net()
        ddp = DistributedDataParallel(model, process_group=comm.new_group_from_transport(t),
                                      overlap=False)
        sl = slice(2 * t.rank, 2 * t.rank + 2)
        nn.CrossEntropyLoss()(ddp(Tensor(x[sl])), Tensor(y[sl])).backward()
        views = {id(v) for b in ddp.buckets for v in b.views}
        assert all(id(p.grad.array) in views for p in model.parameters())
        ddp.close()
        return [p.grad.array.copy() for p in model.parameters()]

    grads = run_threads(2, body, timeout_s=60)
    ref = conv_net()
    nn.CrossEntropyLoss()(ref(Tensor(x)), Tensor(y)).backward()
    for r in range(2):
        for g, p in zip(grads[r], ref.parameters()):
            np.testing.assert_allclose(g, p.grad, rtol=1e-5, atol=1e-6)


# ---- the prescaled hook: the average folded into backward's write (a named fast path) ----

def test_prescaled_hook_folds_the_average_into_the_write_and_resets_after():
    from minidist.ddp.hooks import prescaled_allreduce_hook
    m, ref = big_mlp(), big_mlp()
    params = list(m.parameters())
    calls = []
    reducer = reducer_for(params, 2, calls)
    reducer.comm_hook = prescaled_allreduce_hook
    x = Tensor(np.random.default_rng(0).normal(size=(2, 256)).astype(np.float32))
    (ref(x) ** 2).mean().backward()
    for p in params:
        p.grad = None
    reducer.prepare_for_forward()
    assert all(d.scale == 0.5 for d in (p.grad_destination for p in params))
    loss = (m(x) ** 2).mean()
    peak = backward_peak_bytes(loss.backward)
    assert calls == ["sum"] * len(reducer.buckets)      # no divide pass: a SUM is the average
    assert peak < m[0].weight.array.nbytes // 4, peak    # grad / n written, not copied in
    for p, q in zip(params, ref.parameters()):
        np.testing.assert_allclose(p.grad, q.grad / 2, rtol=1e-6, atol=1e-8)
    assert all(p.grad_destination.scale == 1.0 for p in params)   # nothing averaged after
    (m(x) ** 2).mean().backward()                        # no prepare: accumulates the full grad
    for p, q in zip(params, ref.parameters()):
        np.testing.assert_allclose(p.grad, 1.5 * q.grad, rtol=1e-5, atol=1e-8)
    reducer.prepare_for_forward()                        # an accumulated slot keeps scale 1
    assert all(p.grad_destination.scale == 1.0 for p in params)
    (m(x) ** 2).mean().backward()                        # and is divided when it is ready
    for p, q in zip(params, ref.parameters()):
        np.testing.assert_allclose(p.grad, 2.5 * q.grad / 2, rtol=1e-5, atol=1e-8)
    reducer.close()


def test_observers_see_the_three_events_in_order():
    from minidist.ddp.observers import ReducerObserver

    class Recorder(ReducerObserver):
        def __init__(self):
            self.events = []

        def bucket_ready(self, bucket):
            self.events.append(("ready", bucket.index))

        def bucket_reduced(self, bucket):
            self.events.append(("reduced", bucket.index, bucket.state.name))

        def step_end(self, reducer):
            self.events.append(("end", reducer.num_syncs))

    class OnlyEnd(ReducerObserver):
        def step_end(self, reducer):
            self.ends = getattr(self, "ends", 0) + 1

    nn.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 300), nn.ReLU(), nn.Linear(300, 1000), nn.ReLU(),
                      nn.Linear(1000, 2))
    params = list(m.parameters())
    calls = []
    reducer = reducer_for(params, 2, calls)
    nb = len(reducer.buckets)
    assert nb >= 2
    rec, end = Recorder(), OnlyEnd()
    reducer.add_observer(rec)
    reducer.add_observer(end)
    assert reducer.observers() == [reducer._nonfinite, rec, end]
    assert end.step_end in reducer._calls["step_end"] and not any(
        getattr(c, "__self__", None) is end for c in reducer._calls["bucket_ready"])
    x = Tensor(np.ones((2, 4), np.float32))
    reducer.prepare_for_forward()
    (m(x) ** 2).mean().backward()
    assert rec.events == [("ready", b) for b in range(nb)] + [
        ("reduced", b, "REDUCED") for b in range(nb)] + [("end", 1)]
    assert end.ends == 1
    reducer.remove_observer(rec)
    reducer.prepare_for_forward()
    (m(x) ** 2).mean().backward()
    assert len(rec.events) == 2 * nb + 1 and end.ends == 2
    reducer.close()


def synced_backward_with(hook=None):
    """One synced backward of big_mlp at n=2 through a recording group, with ``hook`` (the
    default when None): (model, reference model, reduce calls, reducer, backward peak)."""
    m, ref = big_mlp(), big_mlp()
    params = list(m.parameters())
    calls = []
    reducer = reducer_for(params, 2, calls)
    if hook is not None:
        reducer.comm_hook = hook
    x = Tensor(np.random.default_rng(0).normal(size=(2, 256)).astype(np.float32))
    (ref(x) ** 2).mean().backward()
    for p in params:
        p.grad = None
    reducer.prepare_for_forward()
    assert all(p.grad_destination.scale == 1.0 for p in params)   # nothing folded
    loss = (m(x) ** 2).mean()
    return m, ref, calls, reducer, backward_peak_bytes(loss.backward)


def test_textbook_hook_divides_the_bucket_then_sums():
    from minidist.ddp.hooks import allreduce_hook
    m, ref, calls, reducer, peak = synced_backward_with(allreduce_hook)
    params = list(m.parameters())
    assert calls == ["sum"] * len(reducer.buckets)
    assert peak < m[0].weight.array.nbytes // 4, peak    # still written into the slots
    for p, q in zip(params, ref.parameters()):          # the hook divided each bucket by 2
        np.testing.assert_allclose(p.grad, q.grad / 2, rtol=1e-6, atol=1e-8)
    reducer.close()


def test_the_default_hook_is_one_avg_all_reduce(group):
    from minidist.ddp.hooks import avg_allreduce_hook
    ddp = DistributedDataParallel(nn.Linear(3, 2))
    assert ddp.reducer.comm_hook is avg_allreduce_hook
    ddp.close()


def test_default_hook_writes_the_whole_gradient_and_all_reduces_avg():
    m, ref, calls, reducer, peak = synced_backward_with()
    params = list(m.parameters())
    assert calls == ["avg"] * len(reducer.buckets)      # the all-reduce divides: one call each
    assert peak < m[0].weight.array.nbytes // 4, peak    # written into the slots, not copied
    for p, q in zip(params, ref.parameters()):          # (the recording group sums nothing)
        np.testing.assert_array_equal(p.grad, q.grad)
    reducer.close()


@pytest.mark.parametrize("dtype,world_size,divisor,op", [
    (np.float32, 2, 2, "avg"),
    (np.float64, 4, 4, "avg"),
    (np.float16, 2, 2, "sum"),     # divide first: a float16 sum can overflow
    (np.float32, 4, 3, "sum"),     # join(): 3 of 4 ranks trained, divide by 3
    (np.float32, 1, 1, None),      # one rank: the bucket is already the average
])
def test_default_hook_takes_the_textbook_way_where_avg_would_not_be_the_average(
        dtype, world_size, divisor, op):
    from minidist.ddp.hooks import avg_allreduce_hook
    calls = []
    p = Tensor(np.zeros(4, dtype), requires_grad=True)
    (b,) = reducer_for([p], world_size, calls).buckets
    b.divisor = divisor
    b.buffer[...] = 6
    avg_allreduce_hook(None, b)
    assert calls == ([op] if op else [])
    expected = 6 / divisor if op == "sum" else 6       # (the recording group sums nothing)
    np.testing.assert_array_equal(b.buffer, np.full(4, expected, dtype))


def test_a_comm_hook_brings_its_reducer_observer_while_it_is_the_hook():
    from minidist.ddp.hooks import FoldedAverage, allreduce_hook, prescaled_allreduce_hook
    params = list(big_mlp().parameters())
    reducer = reducer_for(params, 2, [])

    def folds():
        return sum(isinstance(o, FoldedAverage) for o in reducer.observers())

    assert folds() == 0                                   # the default brings none
    reducer.comm_hook = prescaled_allreduce_hook
    reducer.comm_hook = prescaled_allreduce_hook          # set twice: still one
    assert folds() == 1 and reducer.comm_hook is prescaled_allreduce_hook
    reducer.comm_hook = allreduce_hook
    assert folds() == 0
    reducer.prepare_for_forward()                         # and nothing scales any more
    assert all(p.grad_destination.scale == 1.0 for p in params)
    reducer.close()
