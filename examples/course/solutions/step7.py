"""Reference solutions of step 7's tasks, done in the library itself (docs/course.md, step 7).

    ./test.sh -m course_7
    COURSE_ANSWERS=mine ./test.sh -m course_7      # your answers in examples/course/exercises/
"""

import numpy as np

from minidist.comm.algorithms.registry import Algorithm, model
from minidist.comm.ops import ReduceOp, finalize


def course_ring_all_reduce(transport, buf, op, tag=0):
    """Step 2's ring for any count (task 2.1), as a registry function: in place, SUM or AVG,
    every message on the call's ``tag`` (the planner gives each call its own)."""
    if op not in (ReduceOp.SUM, ReduceOp.AVG):
        raise ValueError(f"[rank {transport.rank}/{transport.size}] all_reduce(algorithm="
                         f"\"course_ring\"): op {op} is not supported; use SUM or AVG.")
    n, r = transport.size, transport.rank
    base, extra = divmod(buf.size, n)
    b = [c * base + min(c, extra) for c in range(n + 1)]
    chunk = [buf[b[c]:b[c + 1]] for c in range(n)]
    right, left = (r + 1) % n, (r - 1) % n
    incoming = np.empty(b[1] - b[0], buf.dtype)
    for s in range(n - 1):  # reduce-scatter
        send_c, recv_c = (r - s) % n, (r - s - 1) % n
        got = incoming[:chunk[recv_c].size]
        transport.sendrecv(chunk[send_c], right, got, left, tag)
        chunk[recv_c] += got
    for s in range(n - 1):  # all-gather
        send_c, recv_c = (r - s + 1) % n, (r - s) % n
        transport.sendrecv(chunk[send_c], right, chunk[recv_c], left, tag)
    finalize(buf, op, n)  # AVG: divide the sum by n on every rank


def course_ring_cost(n, k, alpha, beta, gamma):
    """The ring's alpha-beta-gamma cost in microseconds for K bytes on n ranks."""
    return 2 * (n - 1) * alpha + 2 * k * (n - 1) / n * beta + k * (n - 1) / n * gamma


def make_entry():
    """Task 7.1: the registry entry. Constants below the shipped ring's make "auto" pick it
    wherever the model decides (a fit or ``python -m minidist.tune`` would measure real ones)."""
    return Algorithm("course_ring", course_ring_all_reduce, cost=course_ring_cost,
                     constants=model(alpha_us=0.01, beta_us_per_byte=1e-9,
                                     gamma_us_per_byte=1e-9))


def norm_recording_hook(state, bucket):
    """Task 7.2: a comm hook that keeps this rank's gradient norm of each bucket (before
    averaging) in ``state[bucket.index]``, then leaves the average over ranks in the bucket."""
    flat = bucket.buffer
    state[bucket.index] = float(np.sqrt(np.dot(flat.astype(np.float64), flat)))
    if bucket.world_size > 1:
        flat /= bucket.divisor
        bucket.all_reduce(flat, "sum")
