"""The threads transport's guarantees, and init_process_group in a single process."""

import datetime

import numpy as np
import pytest

import minidist as md
from minidist.comm import CommError, CommTimeout
from minidist.comm.transports.threads import ThreadWorld, run_threads


def test_send_copies_the_buffer():
    def body(t):
        if t.rank == 0:
            a = np.arange(4, dtype=np.int64)
            t.send(a, 1)
            a[:] = -1  # the message already holds a copy
            return None
        b = np.empty(4, np.int64)
        t.recv(b, 0)
        return b.tolist()

    assert run_threads(2, body, timeout_s=10)[1] == [0, 1, 2, 3]


def test_recv_timeout_names_the_peer():
    world = ThreadWorld(2, timeout_s=0.2)
    t = world.transport(1)
    with pytest.raises(CommTimeout, match=r"\[rank 1/2\] recv\(src=0, tag=0\): no message after"):
        t.recv(np.empty(1), 0)


def test_size_mismatch_is_a_comm_error():
    world = ThreadWorld(2)
    world.transport(0).send(np.zeros(3, np.float32), 1)
    with pytest.raises(CommError, match="got 12 bytes but expected 16"):
        world.transport(1).recv(np.empty(4, np.float32), 0)


def test_run_threads_names_the_failing_rank_and_wakes_the_others():
    def body(t):
        if t.rank == 2:
            raise KeyError("boom")
        t.recv(np.empty(1), 2)  # would wait forever without the abort

    with pytest.raises(RuntimeError, match="rank 2 raised KeyError"):
        run_threads(3, body, timeout_s=10)


def test_run_threads_timeout():
    with pytest.raises(TimeoutError, match=r"ranks \[0\] still running"):
        run_threads(1, lambda t: __import__("time").sleep(1.0), timeout_s=0.1)


@pytest.fixture
def clean_env(monkeypatch):
    for k in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "RANK", "WORLD_SIZE",
              "SLURM_PROCID"):
        monkeypatch.delenv(k, raising=False)
    yield
    md.destroy_process_group()


def test_init_single_process(clean_env):
    g = md.init_process_group(timeout=datetime.timedelta(seconds=5))
    assert md.is_initialized() and g.backend == "local"
    assert (md.get_rank(), md.get_world_size(), md.get_local_rank(), md.is_main_process()) == \
        (0, 1, 0, True)
    a = np.ones(3, np.float32)
    assert md.all_reduce(a, op="avg") is a and a.tolist() == [1, 1, 1]
    assert md.all_gather_object({"a": 1}) == [{"a": 1}]
    with pytest.raises(ValueError, match="already initialized"):
        md.init_process_group()
    md.destroy_process_group()
    assert not md.is_initialized()
    with pytest.raises(RuntimeError, match="call minidist.init_process_group"):
        md.all_reduce(a)


@pytest.mark.parametrize("kwargs,message", [
    ({"backend": "bogus"}, "unknown backend 'bogus'"),
    ({"timeout": -1}, "timeout=-1 must be a positive"),
    ({"backend": "tcp"}, "needs RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT|TCP transport"),
])
def test_init_bad_arguments(clean_env, kwargs, message):
    with pytest.raises((ValueError, RuntimeError), match=message):
        md.init_process_group(**kwargs)
    assert not md.is_initialized()
