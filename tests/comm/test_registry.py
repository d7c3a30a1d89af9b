"""The algorithm registry: every entry carries its function, cost model and ``usable`` check,
and "auto", the calibration and the tables loop over it, so a new entry is all it takes."""

import numpy as np
import pytest

from minidist.comm.algorithms import ALGORITHMS, Algorithm, ring_all_reduce
from minidist.auto import calibrate, select
from minidist.comm.algorithms.registry import model
from minidist.comm.group import ProcessGroup, new_group_from_transport
from minidist.comm.ops import ReduceOp
from minidist.comm.transports.local import LocalTransport
from minidist.comm.transports.threads import run_threads


def test_every_entry_is_complete_and_runs_like_its_function():
    for name, algo in ALGORITHMS.items():
        assert algo.name == name and callable(algo.run) and callable(algo.usable)
        if algo.candidate:  # "auto" weighs it: it needs a cost formula and constants
            assert algo.cost is not None and name in select.COST and name in select.MODEL
            assert name in select.CANDIDATES
    assert select.CANDIDATES[:5] == ["ring", "tree", "rd", "mpi", "shm"]
    assert "direct" not in select.CANDIDATES and "shm_zc" in select.COST  # a variant
    buf = np.arange(4, dtype=np.float32)
    ALGORITHMS["ring"](LocalTransport(), buf, ReduceOp.SUM)  # one rank: unchanged
    assert buf.tolist() == [0, 1, 2, 3]


def test_usable_is_the_capability_check():
    t = LocalTransport()
    host = np.zeros(4, np.float32)
    assert ALGORITHMS["ring"].usable(t, host, 0)
    assert not ALGORITHMS["mpi"].usable(t, host, 0)  # no MPI here
    assert not ALGORITHMS["shm"].usable(t, host, 0)  # no shared-memory node
    assert not ALGORITHMS["cuda_ipc"].usable(t, host, 0)  # not a device buffer


@pytest.fixture
def saved_registry():
    state = (dict(ALGORITHMS), dict(select.MODEL), dict(select.COST), list(select.CANDIDATES))
    yield
    algos, model_, cost, cands = state
    ALGORITHMS.clear()
    ALGORITHMS.update(algos)
    select.MODEL.clear()
    select.MODEL.update(model_)
    select.COST.clear()
    select.COST.update(cost)
    select.CANDIDATES[:] = cands
    select.load_model({})  # expire memoized choices


def test_a_new_entry_is_all_auto_needs(saved_registry):
    calls = []

    def half_ring_all_reduce(transport, buf, op, tag=0):
        calls.append((transport.rank, buf.size))
        ring_all_reduce(transport, buf, op, tag)

    select.register(Algorithm("half_ring", half_ring_all_reduce,
                              cost=lambda n, k, a, b, g: 0.5 * (a + k * b),
                              constants=model(0.01, 1e-9)))
    assert "half_ring" in select.CANDIDATES and "half_ring" in select.MODEL

    def body(t):
        g = new_group_from_transport(t)
        x = np.full(1000, t.rank + 1.0, np.float32)
        plan = g.plan_all_reduce(x)
        g.all_reduce(x)
        return plan.algorithm, plan.reason, x[:2].tolist(), g.auto_table()["candidates"]

    out = run_threads(2, body, timeout_s=30)
    for name, reason, vals, cands in out:
        assert name == "half_ring" and "half_ring" in reason and vals == [3.0, 3.0]
        assert "half_ring" in cands
    assert sorted(calls) == [(0, 1000), (1, 1000)]


def test_an_unusable_entry_is_never_chosen(saved_registry):
    select.register(Algorithm("nowhere", ring_all_reduce, usable=lambda t, b, s: False,
                              cost=lambda n, k, a, b, g: 0.0, constants=model(0.0, 0.0)))

    def body(t):
        g = new_group_from_transport(t)
        return g.plan_all_reduce(np.ones(8, np.float32)).algorithm, g.planner.candidates(
            np.ones(8, np.float32))

    for name, cands in run_threads(2, body, timeout_s=30):
        assert name != "nowhere" and "nowhere" not in cands


def test_a_preferred_entry_takes_the_call_when_usable(saved_registry):
    select.register(Algorithm("small_first", ring_all_reduce, candidate=False,
                              usable=lambda t, b, s: b.nbytes <= 64,
                              preferred="small messages: small_first"))
    g = ProcessGroup(LocalTransport())
    assert g.plan_all_reduce(np.ones(8, np.float32)).algorithm == "small_first"
    assert g.plan_all_reduce(np.ones(64, np.float32)).algorithm != "small_first"


def test_calibration_times_the_usable_candidates(saved_registry):
    select.register(Algorithm("half_ring", ring_all_reduce,
                              cost=lambda n, k, a, b, g: 0.5 * (a + k * b),
                              constants=model(0.01, 1e-9)))

    def body(t):
        return calibrate.measure(new_group_from_transport(t), quick=True, max_bytes=32)

    times = run_threads(2, body, timeout_s=60)[0]
    assert set(times["plain"][8]) == {"ring", "tree", "rd", "half_ring"}


def test_a_plan_runs_the_prepared_function_where_usable_held(saved_registry):
    # ``prepare`` binds what ``usable`` established once per plan (one size and dtype: it is
    # given the buffer); a plan whose buffer kind is not usable (here: any stream but 0) runs
    # the checking function instead.
    prepared, checked, sizes = [], [], []

    def checking_all_reduce(transport, buf, op, tag=0):
        checked.append(transport.rank)
        ring_all_reduce(transport, buf, op, tag)

    def prepare(transport, flat):
        sizes.append(flat.size)

        def run(buf, op, tag):
            prepared.append(transport.rank)
            ring_all_reduce(transport, buf, op, tag)
        return run

    ALGORITHMS["bound"] = Algorithm("bound", checking_all_reduce, candidate=False,
                                    usable=lambda t, b, stream: not stream, prepare=prepare)

    def body(t):
        g = new_group_from_transport(t)
        x = np.full(8, t.rank + 1.0, np.float32)
        g.all_reduce(x, algorithm="bound")  # stream 0: usable, prepared
        g.all_reduce(x, algorithm="bound")  # the same plan
        g.all_reduce(x, algorithm="bound", tag=3)  # another stream: the checking function
        return x.tolist()

    out = run_threads(2, body, timeout_s=30)
    assert all(v == [12.0] * 8 for v in out)  # (1 + 2) * 2 * 2
    assert sorted(prepared) == [0, 0, 1, 1] and sorted(checked) == [0, 1]
    assert sizes == [8, 8]  # once per rank
