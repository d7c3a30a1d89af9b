"""Reference solutions of step 5's tasks (docs/course.md, step 5). Check them with

    ./test.sh -m course_5
    COURSE_ANSWERS=mine ./test.sh -m course_5      # your answers in examples/course/exercises/
"""

import time

import minidist as md
from minidist import nn


def predict_launches(sizes, cap_bytes):
    """Task 5.1: for each bucket, in launch order, how many gradients backward has still to
    compute when the bucket is launched. ``sizes``: gradient bytes in the order backward
    completes them (reverse parameter order), which is also step 5's bucket order."""
    out, size, current = [], 0, 0
    for i, nbytes in enumerate(sizes):
        if current and size + nbytes > cap_bytes:  # bucket closed by the previous gradient
            out.append(len(sizes) - i)
            current, size = 0, 0
        current += 1
        size += nbytes
    return out + [0]  # the last bucket waits for the last gradient: nothing left to hide behind


def launch_fractions(model, x, y, cap_bytes):
    """Task 5.2: for each bucket, the fraction of backward's time that had passed when its last
    gradient was ready (when step 5 launches it)."""
    params = list(reversed(list(model.parameters())))
    bucket_of, size, index = {}, 0, 0
    for p in params:
        if size and size + p.array.nbytes > cap_bytes:
            index, size = index + 1, 0
        bucket_of[id(p)] = index
        size += p.array.nbytes
    missing = [0] * (index + 1)
    for p in params:
        missing[bucket_of[id(p)]] += 1
    ready = [0.0] * (index + 1)

    def hook(p):
        b = bucket_of[id(p)]
        missing[b] -= 1
        if missing[b] == 0:
            ready[b] = time.perf_counter()

    handles = [p.register_post_accumulate_grad_hook(hook) for p in params]
    loss = nn.CrossEntropyLoss()(model(md.Tensor(x)), md.Tensor(y))
    t0 = time.perf_counter()
    loss.backward()
    total = time.perf_counter() - t0
    for h in handles:
        h.remove()
    return [(t - t0) / total for t in ready]


def predict_swapped(a0, b0, a1, b1):
    """Task 5.3: what rank 0 holds in (a, b) when it reduces a then b while rank 1 reduces b
    then a, each with step 1's naive all-reduce: the first calls pair up, so a meets b."""
    return a0 + b1, b0 + a1
