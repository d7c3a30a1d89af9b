"""Reference solutions of step 1's tasks (docs/course.md, step 1). Check them with

    ./test.sh -m course_1                          # these solutions pass, the stubs fail
    COURSE_ANSWERS=mine ./test.sh -m course_1      # your answers in examples/course/exercises/
"""

import numpy as np


def naive_cost(n, nbytes):
    """Task 1.1: (messages, bytes) that ONE rank sends in step 1's naive all-reduce."""
    return n - 1, (n - 1) * nbytes


def arrival_order_all_reduce(t, buf):
    """Task 1.2: add each row to a running sum as it arrives (own row first, then r-1, r-2...)."""
    n, r = t.size, t.rank
    total = buf.copy()
    incoming = np.empty_like(buf)
    for s in range(1, n):
        t.sendrecv(buf, (r + s) % n, incoming, (r - s) % n)
        total += incoming  # the row of rank r-s: a different order on every rank
    buf[:] = total


def rows_that_disagree():
    """Task 1.2: three float32 rows whose arrival-order sums differ between ranks.

    Rank 0 adds 1e8 + (-1e8) + 1 = 1; rank 1 adds 1 + 1e8 (= 1e8: float32 keeps about 7
    digits, the 1 is rounded away) + (-1e8) = 0.
    """
    return np.array([[1e8], [1.0], [-1e8]], np.float32)


def direct_all_reduce(t, buf):
    """Task 1.3: everyone sends to rank 0, which adds in rank order and sends the sum back."""
    n, r = t.size, t.rank
    if n == 1:
        return
    if r == 0:
        incoming = np.empty_like(buf)
        for src in range(1, n):
            t.recv(incoming, src)
            buf += incoming
        for dst in range(1, n):
            t.send(buf, dst)
    else:
        t.send(buf, 0)
        t.recv(buf, 0)


def root_messages(n):
    """Task 1.3: (messages rank 0 sends, messages rank 0 receives) in direct_all_reduce."""
    return n - 1, n - 1
