"""Reference solutions of step 2's tasks (docs/course.md, step 2). Check them with

    ./test.sh -m course_2
    COURSE_ANSWERS=mine ./test.sh -m course_2      # your answers in examples/course/exercises/
"""

import math
import runpy
from pathlib import Path

import numpy as np

# Task 2.1: the ring for any count, written out (and runnable under mpirun) in ring_any_count.py
ring_all_reduce = runpy.run_path(str(Path(__file__).with_name("ring_any_count.py")))[
    "ring_all_reduce"]


def reduce_scatter(t, buf):
    """Task 2.2: step 2's first half: afterwards chunk (r+1) % n of ``buf`` holds the full sum."""
    n, r = t.size, t.rank
    chunks = buf.reshape(n, -1)
    incoming = np.empty_like(chunks[0])
    for s in range(n - 1):
        t.sendrecv(chunks[(r - s) % n], (r + 1) % n, incoming, (r - 1) % n)
        chunks[(r - s - 1) % n] += incoming


def all_gather(t, buf):
    """Task 2.2: step 2's second half: pass the finished chunks once around the ring."""
    n, r = t.size, t.rank
    chunks = buf.reshape(n, -1)
    for s in range(n - 1):
        t.sendrecv(chunks[(r - s + 1) % n], (r + 1) % n, chunks[(r - s) % n], (r - 1) % n)


def ring_messages_per_rank(n):
    """Task 2.3: messages one rank sends in the ring all-reduce."""
    return 2 * (n - 1)


def predicted_steps(algorithm, n):
    """Task 2.3: logical steps of ``minidist.viz.record(algorithm, n)`` (8 elements)."""
    if algorithm == "ring":
        return 2 * (n - 1)  # reduce-scatter n-1, all-gather n-1: each waits on the previous
    if algorithm == "rd":
        p = 2 ** int(math.log2(n))
        return int(math.log2(p)) + (2 if n != p else 0)  # the fold before, the unfold after
    raise ValueError(algorithm)
