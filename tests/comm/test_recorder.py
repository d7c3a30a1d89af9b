"""The recorded messages of each algorithm match the cost formulas of docs/algorithms.md."""

import math

import numpy as np
import pytest

from minidist.viz import Recorder, record


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_ring_is_2_n_minus_1_steps_one_message_each(n):
    rec = record("ring", n, numel=2 * n)
    assert rec.steps() == 2 * (n - 1)
    for r in range(n):
        sent = rec.sent_by(r)
        assert [m.step for m in sent] == list(range(2 * (n - 1)))
        assert all(m.dst == (r + 1) % n and m.stop - m.start == 2 for m in sent)  # one chunk


@pytest.mark.parametrize("n", [2, 4, 8])
def test_recursive_doubling_is_log2_n_rounds(n):
    rec = record("rd", n)
    assert rec.steps() == int(math.log2(n))
    assert len(rec.messages) == n * int(math.log2(n))
    for m in rec.messages:  # step k pairs ranks that differ in bit k, whole buffer
        assert m.dst == m.src ^ (1 << m.step) and (m.start, m.stop) == (0, 8)


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_tree_messages_and_rounds(n):
    rec = record("tree", n)
    lg = math.ceil(math.log2(n))
    assert len(rec.messages) == 2 * (n - 1)               # each non-root: one up, one down
    assert rec.steps() <= 2 * lg
    if n & (n - 1) == 0:
        assert rec.steps() == 2 * lg
    assert max(len(rec.sent_by(r)) for r in range(n)) <= 1 + lg


def test_recorder_delegates_and_locates_slices():
    from minidist.comm.transports.threads import run_threads
    rec = Recorder()

    def body(t):
        buf = np.arange(6, dtype=np.float64)
        rt = rec.wrap(t, watch=buf)
        if t.rank == 0:
            rt.send(buf[2:5], 1)
            rt.send(np.zeros(2), 1)
        else:
            got = np.empty(3)
            rt.recv(got, 0)
            rt.recv(np.empty(2), 0)
            return got.tolist()

    assert run_threads(2, body, timeout_s=10)[1] == [2.0, 3.0, 4.0]
    a, b = rec.messages
    assert (a.step, a.src, a.dst, a.nbytes, a.start, a.stop) == (0, 0, 1, 24, 2, 5)
    assert (b.step, b.start) == (1, None)
