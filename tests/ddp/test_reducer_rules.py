"""The Reducer's rules (minidist/ddp/reducer.py's docstring), each with a test that fails when
the rule is broken: buckets launch in index order, the hook of the last bucket waits for the
comm thread, and the end-of-backward check raises before an optimizer step."""

import time

import numpy as np
import pytest

from ddp_grad_matrix import Block, LaunchOrder, Net, bucket_caps, forward_order, reference
from ddp_grad_matrix import schedule
from minidist import comm
from minidist.comm.transports.threads import run_threads
from minidist.ddp import DistributedDataParallel
from minidist.ddp.bucket import BucketState
from minidist.ddp.hooks import avg_allreduce_hook
from minidist.tensor import Tensor


def test_buckets_launch_in_index_order_when_ranks_fill_them_in_other_orders(group):
    # Three ranks run the layers in three orders, so each fills the (equal-sized) buckets in
    # another order; launched as they fill, rank 0's bucket 0 would be summed with rank 1's
    # bucket 1. Launched in index order, every rank reduces bucket k with bucket k.
    block, world = Block("rank_order", find_unused=False, overlap=True), 3

    def body(t):
        model = Net(forward_order(block.layout, t.rank), unused=False)
        ddp = DistributedDataParallel(model, process_group=comm.new_group_from_transport(t),
                                      overlap=True, **bucket_caps(block.layout))
        launches = LaunchOrder()
        ddp.reducer.add_observer(launches)
        got = schedule(model, ddp, "none", "none", t.rank, world, ddp)
        ddp.close()
        return launches.order, got["final"]

    runs = run_threads(world, body, timeout_s=60)
    want = reference(block, "none", "none", world)["final"]
    for order, final in runs:
        assert order == [0, 1, 2]
        for n, w in want.items():   # three ranks: the average's rounding depends on the order
            np.testing.assert_allclose(final[n], w, rtol=1e-13, atol=1e-16, err_msg=n)


def slow_avg_hook(state, bucket):
    """The default average, started late: a backward that did not wait would return first."""
    time.sleep(0.05)
    avg_allreduce_hook(state, bucket)


def test_backward_returns_only_after_the_comm_thread_reduced_every_bucket(group):
    block = Block("per_param", find_unused=False, overlap=True)

    def body(t):
        model = Net(forward_order(block.layout, t.rank), unused=False)
        ddp = DistributedDataParallel(model, process_group=comm.new_group_from_transport(t),
                                      overlap=True, comm_hook=slow_avg_hook,
                                      **bucket_caps(block.layout))
        assert ddp.reducer.overlap and len(ddp.buckets) == 6
        got = schedule(model, ddp, "none", "none", t.rank, 2, ddp)  # reads right after backward
        states = [b.state for b in ddp.buckets]
        ddp.close()
        return states, got["final"]

    want = reference(block, "none", "none", 2)["final"]
    for states, final in run_threads(2, body, timeout_s=60):
        assert states == [BucketState.REDUCED] * 6
        for n, w in want.items():
            assert np.array_equal(final[n], w), n


def test_a_parameter_without_gradient_raises_at_the_end_of_backward(group):
    model = Net([0, 1, 2], unused=True)   # "unused" gets no gradient, and nothing marks it
    ddp = DistributedDataParallel(model, overlap=False)
    x = Tensor(np.ones((2, 5)))
    loss = (ddp(x) ** 2).mean()
    with pytest.raises(RuntimeError, match=r"'unused'.*find_unused_parameters=True"):
        loss.backward()
    ddp.close()


def test_every_rank_raises_at_the_end_of_a_backward_that_skipped_a_layer(group):
    # Both ranks skip layer 1 (bucket 1): bucket 0 is launched and reduced on the comm
    # thread, bucket 1 never becomes ready, so bucket 2 must not be launched either. The
    # check at the end of backward waits for bucket 0, then raises naming w1 and b1, before
    # an optimizer step could apply gradients that were never averaged.
    def body(t):
        model = Net([0, 2], unused=False)
        ddp = DistributedDataParallel(model, process_group=comm.new_group_from_transport(t),
                                      overlap=True, **bucket_caps("rank_order"))
        launches = LaunchOrder()
        ddp.reducer.add_observer(launches)
        try:
            (ddp(Tensor(np.ones((2, 5)))) ** 2).mean().backward()
        except RuntimeError as e:
            return str(e), launches.order, [b.state for b in ddp.buckets]
        finally:
            ddp.close()
        return "backward returned", launches.order, None

    for msg, order, states in run_threads(2, body, timeout_s=30):
        assert "backward of step 0 finished without a gradient" in msg, msg
        assert "['b1', 'w1']" in msg and "bucket(s) [1, 2]" in msg, msg
        assert order == [0] and states[0] is BucketState.REDUCED
