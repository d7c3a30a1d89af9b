"""``minidist.data.resume.batch_position``: the batch a sharded DataLoader handed out last in
this thread, which DDP's step labels carry (minidist/watch/step_labels.py)."""

import threading

import numpy as np

from minidist.data import ArrayDataset, DataLoader, DistributedSampler
from minidist.data.resume import batch_position

DATA = ArrayDataset(np.zeros((16, 1), np.float32), np.zeros(16, np.int64))


def sharded(**kw):
    return DataLoader(DATA, batch_size=2, sampler=DistributedSampler(DATA, num_replicas=2,
                                                                      rank=0, **kw))


def test_a_sharded_pass_counts_its_batches_and_ends_with_none():
    loader = sharded(shuffle=True, seed=0)
    loader.set_epoch(3)
    assert batch_position() is None
    seen = [batch_position() for _ in loader]
    assert seen == [(3, 0), (3, 1), (3, 2), (3, 3)]
    assert batch_position() is None


def test_an_inner_pass_restores_the_outer_one():
    outer, inner = sharded(), sharded()
    it = iter(outer)
    next(it)
    next(it)
    next(iter(inner))  # a peek: its pass ends when the iterator is dropped
    assert batch_position() == (0, 1)
    for _ in inner:
        pass
    assert batch_position() == (0, 1)
    it.close()
    assert batch_position() is None


def test_unsharded_loaders_and_other_threads_leave_no_position():
    for _ in DataLoader(DATA, batch_size=4, shuffle=True):
        assert batch_position() is None
    it = iter(sharded())
    next(it)
    other = []
    t = threading.Thread(target=lambda: other.append(batch_position()))
    t.start()
    t.join()
    assert other == [None] and batch_position() == (0, 0)
    it.close()


def test_a_resumed_pass_starts_at_the_saved_batch():
    loader = sharded()
    it = iter(loader)
    next(it)
    next(it)
    state = loader.state_dict()
    it.close()
    again = sharded()
    again.load_state_dict(state)
    assert [batch_position() for _ in again] == [(0, 2), (0, 3)]


def test_worker_threads_do_not_move_the_position():
    loader = DataLoader(DATA, batch_size=2, num_workers=2,
                        sampler=DistributedSampler(DATA, num_replicas=2, rank=1))
    assert [batch_position() for _ in loader] == [(0, 0), (0, 1), (0, 2), (0, 3)]


def test_passes_that_end_out_of_order_leave_no_position():
    # zip(a, b): a's pass ends first (StopIteration), b's when zip is dropped; neither may
    # leave its position behind (a stale one would label later steps of this thread)
    a, b = sharded(), sharded()
    seen = [batch_position() for _ in zip(a, b)]
    assert seen == [(0, 0), (0, 1), (0, 2), (0, 3)]
    assert batch_position() is None
    it = iter(a)
    next(it)
    inner = iter(b)
    next(inner)
    next(inner)
    assert batch_position() == (0, 1)  # the newest running pass
    it.close()  # the older pass ends first
    assert batch_position() == (0, 1)
    inner.close()
    assert batch_position() is None
