"""Step 1's tasks: edit the functions below, then check your answers (docs/course.md, step 1):

    COURSE_ANSWERS=mine ./test.sh -m course_1              # every task of step 1
    COURSE_ANSWERS=mine ./test.sh -m course_1 -k task_1_2  # one task

Each check runs your code on thread ranks (one process, no MPI) and says what it expected,
what came back and which idea to revisit. Reference solutions: examples/course/solutions/.
"""

import numpy as np


def naive_cost(n, nbytes):
    """Task 1.1: step 1's ``naive_all_reduce`` on n ranks, a buffer of ``nbytes`` bytes each.

    Return ``(messages, bytes)`` that ONE rank sends. The check records a run at n = 1..4 and
    compares. Then time the real thing (``--numel 1000000`` at n = 2, 3, 4 under mpirun.sh):
    the bytes grow as your formula says; does the time?
    """
    raise NotImplementedError("task 1.1: return (messages, bytes) sent per rank")


def arrival_order_all_reduce(t, buf):
    """Task 1.2: step 1's naive all-reduce, but adding each row to a running sum the moment it
    arrives: your own row first, then the row of rank r-1, r-2, ... (the order ``sendrecv``
    delivers them), instead of storing the rows and summing them in rank order.

    The code below is step 1's version, in rank order: change it.
    """
    n, r = t.size, t.rank
    rows = np.empty((n, buf.size), buf.dtype)
    rows[r] = buf
    for s in range(1, n):
        t.sendrecv(buf, (r + s) % n, rows[(r - s) % n], (r - s) % n)
    buf[:] = rows.sum(axis=0)


def rows_that_disagree():
    """Task 1.2: a float32 array of shape (3, k): row r is rank r's buffer. Choose values for
    which your ``arrival_order_all_reduce`` leaves DIFFERENT bits on two of the three ranks
    (hint: float32 keeps about 7 significant digits). Why does step 1 sum in rank order?
    """
    return np.ones((3, 4), np.float32)


def direct_all_reduce(t, buf):
    """Task 1.3: the library's ``direct``: every rank sends its buffer to rank 0; rank 0 adds
    them in rank order (x0 + x1 + ...) and sends the sum back to every rank. In place."""
    raise NotImplementedError("task 1.3: write the gather-to-0, add, send-back all-reduce")


def root_messages(n):
    """Task 1.3: ``(sent, received)``: the messages rank 0 sends and receives in your
    ``direct_all_reduce`` on n ranks (compare with the naive all-reduce's n-1 per rank)."""
    raise NotImplementedError("task 1.3: count rank 0's messages")
