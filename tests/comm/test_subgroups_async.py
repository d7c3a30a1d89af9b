"""Sub-groups and async collectives on the threads transport (4 thread ranks, one process).

Sub-groups are ``SubgroupTransport`` views (comm/transports/subgroup.py): ranks renumbered, their
own tag space. Async collectives run on the group's worker in issue order (comm/work.py).
"""

import threading
import time

import numpy as np
import pytest

from minidist.comm import CommTimeout, ReduceOp
from minidist.comm.group import new_group_from_transport
from minidist.comm.transports.base import MAX_GROUPS, Transport
from minidist.comm.transports.local import LocalTransport
from minidist.comm.transports.subgroup import SubgroupTransport
from minidist.comm.transports.threads import ThreadWorld, run_threads

N = 4


def test_a_sub_group_runs_every_collective_and_outsiders_get_none():
    rng = np.random.default_rng(0)
    x_all = rng.normal(size=(N, 37)).astype(np.float32)

    def body(t):
        world = new_group_from_transport(t)
        sub = world.new_group([3, 1])                 # world 3 is group rank 0, world 1 rank 1
        other = world.new_group([0, 2])
        if sub is None:
            assert t.rank in (0, 2) and other is not None
            return None
        assert other is None and isinstance(sub.transport, SubgroupTransport)
        out = {"rank": sub.rank, "size": sub.size}
        x = x_all[t.rank].copy()
        sub.all_reduce(x)
        out["sum"] = x
        out["bcast"] = sub.broadcast(np.full(2, float(t.rank)), src=1)
        out["reduce"] = sub.reduce(np.full(2, float(t.rank)), dst=0, op="max")
        out["gather"] = sub.all_gather(np.array([t.rank]))
        chunk = np.zeros(1)
        sub.reduce_scatter(chunk, np.arange(2.0) * (t.rank + 1))
        out["scatter"] = chunk[0]
        sub.barrier()
        out["objects"] = sub.all_gather_object({"w": t.rank})
        for algorithm in ("ring", "tree", "rd", "direct"):
            y = x_all[t.rank].copy()
            sub.all_reduce(y, algorithm=algorithm)
            np.testing.assert_allclose(y, x_all[[3, 1]].sum(0), rtol=1e-6)
        return out

    res = run_threads(N, body, timeout_s=30)
    assert res[0] is None and res[2] is None
    want = x_all[1] + x_all[3]
    for r in (1, 3):
        np.testing.assert_allclose(res[r]["sum"], want, rtol=1e-6)
        assert np.array_equal(res[r]["bcast"], [1.0, 1.0])   # group rank 1 is world rank 1
        assert np.array_equal(res[r]["gather"].ravel(), [3, 1])
        assert res[r]["objects"] == [{"w": 3}, {"w": 1}]
    assert (res[3]["rank"], res[1]["rank"], res[1]["size"]) == (0, 1, 2)
    assert np.array_equal(res[3]["reduce"], [3.0, 3.0])     # max on group rank 0 (world 3)
    # chunk r of sum over members of arange(2) * (world rank + 1): 0*(4+2), 1*(4+2)
    assert (res[3]["scatter"], res[1]["scatter"]) == (0.0, 6.0)


def test_world_and_sub_group_messages_never_mix():
    """Overlapping groups, interleaved: each collective sees only its own group's messages."""
    rng = np.random.default_rng(1)
    x_all = rng.normal(size=(N, 1000))

    def body(t):
        world = new_group_from_transport(t)
        low, high = world.new_group([0, 1, 2]), world.new_group([1, 2, 3])
        out = []
        for step in range(3):
            x = x_all[t.rank] * (step + 1)
            world.all_reduce(x, algorithm="ring")
            out.append(x)
            for g, ranks in ((low, [0, 1, 2]), (high, [1, 2, 3])):
                if g is not None:
                    y = x_all[t.rank] * (step + 1)
                    g.all_reduce(y, algorithm="ring")
                    out.append(y)
                    np.testing.assert_allclose(y, x_all[ranks].sum(0) * (step + 1))
        return out

    res = run_threads(N, body, timeout_s=30)
    np.testing.assert_allclose(res[0][0], x_all.sum(0))


def test_async_collectives_complete_in_issue_order_and_sync_ones_wait_for_them():
    def body(t):
        g = new_group_from_transport(t)
        x = np.array([float(t.rank + 1)])
        works = [g.run_async("all_reduce", lambda: g.all_reduce(x), x) for _ in range(3)]
        y = np.array([2.0])
        g.all_reduce(y, op=ReduceOp.MAX)            # synchronous: after the three queued ones
        assert all(w.is_completed() for w in works) and all(w.wait(5) for w in works)
        order = [e.collective for e in g.ledger.entries()]
        return float(x[0]), float(y[0]), order, works[0].result()[0] is x

    res = run_threads(N, body, timeout_s=30)
    total = sum(range(1, N + 1))
    for x, y, order, same in res:
        assert x == total * N * N and y == 2.0 and same   # 10 -> 40 -> 160
        assert order == ["all_reduce"] * 4


def test_async_wait_raises_on_time_when_a_peer_has_not_joined():
    joined = threading.Event()

    def body(t):
        g = new_group_from_transport(t)
        x = np.array([float(t.rank + 1)])
        if t.rank == 0:
            work = g.run_async("all_reduce", lambda: g.all_reduce(x), x)
            start = time.monotonic()
            with pytest.raises(CommTimeout, match=r"\[rank 0/2\] Work.wait\(all_reduce\): not "
                                                  r"complete after 0.3 s.*same order"):
                work.wait(timeout=0.3)
            waited = time.monotonic() - start
            assert not work.is_completed() and work.exception() is None
            joined.set()
            assert work.wait(timeout=20) and work.is_completed()
            return float(x[0]), waited
        assert joined.wait(20)
        g.all_reduce(x)
        return float(x[0]), None

    (x0, waited), (x1, _) = run_threads(2, body, timeout_s=30)
    assert x0 == x1 == 3.0 and waited >= 0.3


def test_a_failed_async_collective_raises_at_wait_and_fails_the_ones_behind_it():
    def body(t):
        g = new_group_from_transport(t)
        if t.rank == 1:
            return None                              # never joins; the transport gives up
        x = np.ones(2)
        first = g.run_async("all_reduce", lambda: g.all_reduce(x), x)
        second = g.run_async("broadcast", lambda: g.broadcast(x), x)
        with pytest.raises(CommTimeout):
            first.wait()
        with pytest.raises(Exception, match="earlier async collective of this group failed"):
            second.wait()
        return repr(first)

    world = ThreadWorld(2, timeout_s=0.5)
    assert run_threads(2, body, timeout_s=30, world=world)[0] == "Work(all_reduce, failed)"


def test_one_rank_and_local_groups_complete_eagerly():
    g = new_group_from_transport(LocalTransport())
    x = np.ones(3)
    w = g.run_async("all_reduce", lambda: g.all_reduce(x), x)
    assert w.is_completed() and w.wait(0) and w.result()[0] is x
    assert g.new_group([0]) is g
    with pytest.raises(ValueError, match=r"new_group\(ranks=\[0, 0\]\): ranks must be distinct"):
        g.new_group([0, 0])


def test_sub_group_numbers_agree_and_are_bounded():
    t = ThreadWorld(2).transport(0)
    assert t.split([1], 5.0) is None and t.subgroups_made == 1   # counted on non-members too
    sub = t.split([0, 1], 5.0)
    assert isinstance(sub, SubgroupTransport) and sub.group == 2 and sub.timeout_s == 5.0
    assert sub.max_tag == Transport.max_tag < (1 << 40) and MAX_GROUPS >= 1 << 20
    with pytest.raises(NotImplementedError, match="make every group from the world"):
        sub.split([0], 5.0)
