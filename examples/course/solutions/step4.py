"""Reference solutions of step 4's tasks (docs/course.md, step 4). Check them with

    ./test.sh -m course_4
    COURSE_ANSWERS=mine ./test.sh -m course_4      # your answers in examples/course/exercises/
"""

import numpy as np


def plan(sizes, cap_bytes):
    """Step 4's plan_buckets on sizes in bytes (already in backward order): lists of indices."""
    buckets, current, size = [], [], 0
    for i, nbytes in enumerate(sizes):
        if current and size + nbytes > cap_bytes:
            buckets.append(current)
            current, size = [], 0
        current.append(i)
        size += nbytes
    return buckets + [current]


def allreduce_time_model(sizes, cap_bytes, n, alpha_us, beta_us_per_byte):
    """Task 4.1: (buckets, microseconds) of step 4's bucketed ring all-reduces, alpha-beta model:
    each bucket of K bytes costs 2(n-1) alpha + 2K(n-1)/n beta."""
    buckets = plan(sizes, cap_bytes)
    us = 0.0
    for b in buckets:
        k = sum(sizes[i] for i in b)
        us += 2 * (n - 1) * alpha_us + 2 * k * (n - 1) / n * beta_us_per_byte
    return len(buckets), us


def grads_into_buckets(params, cap_bytes):
    """Task 4.2: one zeroed flat float32 buffer per bucket, every ``p.grad`` a view into it."""
    ordered = list(reversed(params))
    flats = []
    for b in plan([p.array.nbytes for p in ordered], cap_bytes):
        flat = np.zeros(sum(ordered[i].array.size for i in b), np.float32)
        offset = 0
        for i in b:
            p = ordered[i]
            p.grad = flat[offset:offset + p.array.size].reshape(p.array.shape)  # a view
            offset += p.array.size
        flats.append(flat)
    return flats
