"""The shape of each algorithm, not only its result: message counts and bytes per rank."""

import math

import numpy as np
import pytest

from minidist.comm.algorithms import ALGORITHMS
from minidist.comm.algorithms.ring import chunk_bounds
from minidist.comm.ops import ReduceOp
from minidist.comm.transports.threads import ThreadWorld, run_threads


def counts(name, n, count, dtype=np.float32):
    world = ThreadWorld(n, timeout_s=20)

    def body(t):
        buf = np.ones(count, dtype)
        ALGORITHMS[name](t, buf, ReduceOp.SUM)
        return t.messages_sent, t.bytes_sent

    return run_threads(n, body, timeout_s=20, world=world), world.log


@pytest.mark.parametrize("n", range(2, 9))
@pytest.mark.parametrize("count", [1, 7, 4099])
def test_ring_sends_2n_minus_1_messages_per_rank(n, count):
    per_rank, log = counts("ring", n, count)
    for r, (msgs, nbytes) in enumerate(per_rank):
        assert msgs == 2 * (n - 1), f"rank {r} sent {msgs} messages, expected {2 * (n - 1)}"
        # every chunk except its own one passes through a rank twice at most: 2K(N-1)/N +- chunk
        assert nbytes <= 2 * (n - 1) * (count // n + 1) * 4
    # topology: every message goes to the right neighbour
    assert all(dst == (src + 1) % n for src, dst, _, _ in log)


def test_ring_bytes_are_bandwidth_optimal():
    n, count = 4, 4096  # divisible: exactly 2K(N-1)/N bytes per rank
    per_rank, _ = counts("ring", n, count)
    assert all(nb == 2 * (n - 1) * count * 4 // n for _, nb in per_rank)


@pytest.mark.parametrize("n", range(2, 9))
def test_tree_message_bound(n):
    per_rank, log = counts("tree", n, 100)
    lg = math.ceil(math.log2(n))
    assert all(m <= 1 + lg for m, _ in per_rank), per_rank
    assert sum(m for m, _ in per_rank) == 2 * (n - 1)  # n-1 edges, used up and down
    assert all(nb == 400 for _, _, _, nb in log)  # whole-buffer messages


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
def test_rd_doubling_message_count(n):
    per_rank, _ = counts("rd", n, 10)  # small: plain recursive doubling
    p = 1 << (n.bit_length() - 1)
    lg = int(math.log2(p))
    folded = 2 * (n - p)
    for r, (m, _) in enumerate(per_rank):
        if r < folded:
            assert m == (1 if r % 2 == 0 else lg + 1)
        else:
            assert m == lg


def test_rabenseifner_moves_less_than_doubling():
    n, count = 4, 65536  # 256 KiB -> halving/doubling
    per_rank, _ = counts("rd", n, count)
    for m, nb in per_rank:
        assert m == 2 * 2 and nb == 2 * count * 4 * (n - 1) // n


def test_chunk_bounds_cover_everything():
    for numel in (0, 1, 3, 4, 5, 4099):
        for n in range(1, 9):
            b = chunk_bounds(numel, n)
            sizes = np.diff(b)
            assert b[0] == 0 and b[-1] == numel and sizes.max() - sizes.min() <= 1
