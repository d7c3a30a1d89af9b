"""Step 2's tasks: edit the functions below, then check your answers (docs/course.md, step 2):

    COURSE_ANSWERS=mine ./test.sh -m course_2              # every task of step 2
    COURSE_ANSWERS=mine ./test.sh -m course_2 -k task_2_1  # one task
"""

import numpy as np


def ring_all_reduce(t, buf):
    """Task 2.1: make the ring work when the count is not divisible by n, and when it is
    smaller than n (some chunks are empty). The code below is step 2's: change it.

    Under mpirun: ``./mpirun.sh -n 3 python examples/course/solutions/ring_any_count.py`` runs
    the reference solution the same way.
    """
    n, r = t.size, t.rank
    if buf.size % n:
        raise ValueError(f"[rank {r}/{n}] ring_all_reduce: {buf.size} elements do not split into "
                         f"{n} equal chunks. Pad the buffer (exercise 2.1 lifts this limit).")
    chunks = buf.reshape(n, -1)
    right, left = (r + 1) % n, (r - 1) % n
    incoming = np.empty_like(chunks[0])
    for s in range(n - 1):  # reduce-scatter
        t.sendrecv(chunks[(r - s) % n], right, incoming, left)
        chunks[(r - s - 1) % n] += incoming
    for s in range(n - 1):  # all-gather
        t.sendrecv(chunks[(r - s + 1) % n], right, chunks[(r - s) % n], left)


def reduce_scatter(t, buf):
    """Task 2.2: the first half of step 2's ring on its own (count divisible by n). Afterwards
    chunk (r+1) % n of ``buf`` (the rows of ``buf.reshape(n, -1)``) holds the full sum."""
    raise NotImplementedError("task 2.2: split step 2's ring: the reduce-scatter half")


def all_gather(t, buf):
    """Task 2.2: the second half: starting from what ``reduce_scatter`` left, every rank ends
    with the whole sum (``reduce_scatter`` then ``all_gather`` is the ring all-reduce)."""
    raise NotImplementedError("task 2.2: split step 2's ring: the all-gather half")


def ring_messages_per_rank(n):
    """Task 2.3: how many messages one rank sends in the ring all-reduce on n ranks."""
    raise NotImplementedError("task 2.3: count the ring's messages per rank")


def predicted_steps(algorithm, n):
    """Task 2.3: predict ``minidist.viz.record(algorithm, n).steps()``: the logical steps
    (longest chain of messages that wait on each other) of "ring" and of "rd" (recursive
    doubling, minidist/comm/algorithms/recursive_doubling.py: read how it handles an n that
    is not a power of two) on 8 elements. Try the recorder yourself, then write the formula."""
    raise NotImplementedError("task 2.3: the steps of 'ring' and 'rd' as a formula in n")
