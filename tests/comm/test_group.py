"""ProcessGroup collectives and argument validation, on thread ranks and the local transport."""

import numpy as np
import pytest

from minidist.comm import (CollectiveMismatch, CommError, ProcessGroup, ReduceOp,
                           new_group_from_transport)
from minidist.comm.transports.local import LocalTransport
from minidist.comm.transports.threads import run_threads


def on_threads(n, fn, **group_kwargs):
    return run_threads(n, lambda t: fn(new_group_from_transport(t, **group_kwargs)), timeout_s=30)


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_collectives(n):
    x_all = np.random.default_rng(1).normal(size=(n, 6, 5)).astype(np.float32)

    def body(g):
        r = g.rank
        out = {}
        a = x_all[r].copy()
        assert g.all_reduce(a, op="avg") is a
        out["avg"] = a
        for src in range(n):
            b = x_all[r].copy()
            g.broadcast(b, src=src)
            assert np.array_equal(b, x_all[src])
        for dst in range(n):
            c = x_all[r].copy()
            g.reduce(c, dst=dst, op=ReduceOp.MAX)
            expect = x_all.max(0) if r == dst else x_all[r]
            assert np.array_equal(c, expect), (r, dst)
        out["gather"] = g.all_gather(x_all[r])
        flat = x_all.reshape(n, -1)
        chunk = np.empty(flat.shape[1], np.float32)
        big = np.tile(flat[r], n)  # rank r contributes its row to every chunk
        g.reduce_scatter(chunk, big, op="sum")
        out["rs"] = chunk
        out["obj"] = g.all_gather_object({"rank": r, "name": f"r{r}"})
        out["bobj"] = g.broadcast_object([1, "two", r] if r == n - 1 else None, src=n - 1)
        g.barrier()
        return out

    for r, out in enumerate(on_threads(n, body)):
        np.testing.assert_allclose(out["avg"], x_all.mean(0), rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(out["gather"], x_all)
        np.testing.assert_allclose(out["rs"], x_all.reshape(n, -1).sum(0), rtol=1e-5, atol=1e-5)
        assert out["obj"] == [{"rank": i, "name": f"r{i}"} for i in range(n)]
        assert out["bobj"] == [1, "two", n - 1]


def test_local_group_is_a_no_op():
    g = ProcessGroup(LocalTransport())
    a = np.arange(4, dtype=np.float64)
    g.all_reduce(a, op="avg")
    g.broadcast(a, 0)
    g.barrier()
    assert a.tolist() == [0, 1, 2, 3]
    assert g.all_gather(a).shape == (1, 4) and g.all_gather_object("x") == ["x"]
    with pytest.raises(ValueError, match="single rank"):
        LocalTransport().send(a, 0)


BAD = [
    (lambda g: g.all_reduce(np.ones((4, 4), np.float32)[:, ::2]), "not C-contiguous"),
    (lambda g: g.all_reduce(np.frombuffer(b"\0" * 16, np.float32)), "read-only"),
    (lambda g: g.all_reduce(np.ones(4, np.float32), op="mean"), "unknown reduce op"),
    (lambda g: g.all_reduce(np.ones(4, np.float32), algorithm="fast"), "unknown algorithm"),
    (lambda g: g.all_reduce(np.ones(4, np.complex64)), "dtype complex64 is not supported"),
    (lambda g: g.all_reduce([1.0, 2.0]), "expected a numpy or cupy array"),
    (lambda g: g.broadcast(np.ones(4), src=2), r"src=2 is out of range.*\[0, 2\)"),
    (lambda g: g.reduce(np.ones(4), dst=-1), "dst=-1 is out of range"),
    (lambda g: g.all_gather_into(np.ones(5), np.ones(2)), "needs world_size"),
    (lambda g: g.all_reduce(np.ones(4, np.float32), algorithm="mpi"), "has no MPI Allreduce"),
]


@pytest.mark.parametrize("call,message", BAD)
def test_bad_input_raises_before_any_message(call, message):
    def body(t):
        g = new_group_from_transport(t)
        with pytest.raises(ValueError, match=message) as info:
            call(g)
        assert str(info.value).startswith(f"[rank {t.rank}/2] ")
        return t.messages_sent

    assert run_threads(2, body, timeout_s=10) == [0, 0]


LIKE_A_KNOWN_CALL = [  # each shares (algorithm, op, dtype, size) with the good call below
    (lambda g: g.all_reduce(np.frombuffer(b"\0" * 16, np.float32)), "read-only"),
    (lambda g: g.all_reduce(np.ones(8, np.float32)[::2]), "not C-contiguous"),
    (lambda g: g.all_reduce(np.ones(4, np.float32), tag=True), "tag=True is out of range"),
    (lambda g: g.all_reduce(np.ones(4, np.float32), tag=1.0), "tag=1.0 is out of range"),
]


@pytest.mark.parametrize("call,message", LIKE_A_KNOWN_CALL)
def test_a_call_like_a_known_one_is_still_checked(call, message):
    """A plain call is planned once, then looked up (``planner.known``); the array's layout
    and the stream are still checked on every call."""
    def body(t):
        g = new_group_from_transport(t)
        g.all_reduce(np.ones(4, np.float32))
        g.all_reduce(np.ones(4, np.float32), tag=1)
        assert list(g.planner.known) == [("auto", "sum", np.dtype(np.float32), 4, False)]
        sent = t.messages_sent
        with pytest.raises(ValueError, match=message):
            call(g)
        return t.messages_sent - sent

    assert run_threads(2, body, timeout_s=10) == [0, 0]


def test_known_calls_are_looked_up_and_forgotten_with_the_plans():
    def body(t):
        g = new_group_from_transport(t)
        x = np.ones(6, np.float32)
        plan = g.plan_all_reduce(x)
        key = ("auto", "sum", x.dtype, 6, False)
        assert g.planner.known == {key: plan}
        g.all_reduce(np.ones(6, np.float32))
        g.all_reduce(np.ones(6, np.float32), op=ReduceOp.MAX)  # another op: another entry
        assert g.planner.known[key] is plan and len(g.planner.known) == 2
        window = np.zeros(12, np.float32)  # as if it backed a shared window: another kind
        g.planner.shared_bases = {id(window)}
        g.plan_all_reduce(window[:6])
        assert ("auto", "sum", x.dtype, 6, True) in g.planner.known
        g.planner.forget_plans()  # the chooser's rules changed: nothing known any more
        assert g.planner.known == {}
        return x.tolist()

    assert run_threads(2, body, timeout_s=10) == [[1.0] * 6] * 2


def test_mismatched_shapes_name_the_rank_in_debug_mode():
    def body(g):
        g.all_reduce(np.ones(10 if g.rank != 2 else 12, np.float32), algorithm="ring")

    with pytest.raises(RuntimeError, match=r"rank 2 passed numel=12 elements but rank 0 passed "
                                           r"numel=10 elements") as info:
        on_threads(4, body, check_consistency=True)
    assert isinstance(info.value.__cause__, CommError)


def test_mismatched_dtype_in_debug_mode():
    def body(g):
        g.all_reduce(np.ones(8, np.float32 if g.rank == 0 else np.float64))

    with pytest.raises(RuntimeError, match="rank 1 passed dtype=float64 but rank 0 passed "
                                           "dtype=float32"):
        on_threads(2, body, check_consistency=True)


def test_mismatched_sizes_without_debug_mode_still_error():
    # The counts differ, so the fingerprints (message tags) differ: rank 0 sees rank 1's message
    # of "another call" and both ranks raise the ledger's diagnosis, long before any timeout.
    def body(g):
        g.all_reduce(np.ones(8 if g.rank == 0 else 9, np.float32), algorithm="tree")

    with pytest.raises(RuntimeError, match=r"rank 1 called all_reduce\(9 x float32, sum\) as its "
                                           r"collective #1 at test_group.py:\d+; rank 0 called "
                                           r"all_reduce\(8 x float32, sum\)") as info:
        on_threads(2, body, check_consistency=False)
    assert isinstance(info.value.__cause__, CollectiveMismatch)


def test_broadcast_object_failure_on_src_reaches_every_rank():
    def body(t):
        g = new_group_from_transport(t)
        if t.rank == 0:
            with pytest.raises(ValueError, match="not JSON-serializable"):
                g.broadcast_object({1, 2}, src=0)
        else:
            with pytest.raises(CommError, match="rank 0 could not encode"):
                g.broadcast_object(None, src=0)
        return g.broadcast_object("ok" if t.rank == 0 else None)

    assert run_threads(3, body, timeout_s=10) == ["ok"] * 3
