"""Solution to exercise 2.1: the ring all-reduce for any element count, even fewer than n.

    ./mpirun.sh -n 3 python examples/course/solutions/ring_any_count.py     # checks 0..10 elements

The only change from step 2: the chunks are no longer rows of ``buf.reshape(n, -1)`` but
slices between ``bounds``: n near-equal chunks whose sizes differ by at most one (the first
``numel % n`` get the extra element; some are empty when numel < n). The receive buffer is
sized for the largest chunk and cut to the size of the chunk that arrives.
"""

import argparse
import sys

import numpy as np


def bounds(numel, n):
    """Start of each of n chunks plus the end: chunk c is buf[b[c]:b[c+1]]."""
    base, extra = divmod(numel, n)
    return [c * base + min(c, extra) for c in range(n + 1)]


def ring_all_reduce(t, buf):
    n, r = t.size, t.rank
    b = bounds(buf.size, n)
    chunk = [buf[b[c]:b[c + 1]] for c in range(n)]
    right, left = (r + 1) % n, (r - 1) % n
    incoming = np.empty(b[1] - b[0], buf.dtype)  # chunk 0 is a largest one
    for s in range(n - 1):  # reduce-scatter
        send_c, recv_c = (r - s) % n, (r - s - 1) % n
        got = incoming[:chunk[recv_c].size]
        t.sendrecv(chunk[send_c], right, got, left)
        chunk[recv_c] += got
    for s in range(n - 1):  # all-gather
        send_c, recv_c = (r - s + 1) % n, (r - s) % n
        t.sendrecv(chunk[send_c], right, chunk[recv_c], left)


def main():
    import minidist as md
    t = md.init_process_group().transport
    ok = True
    for numel in range(11):
        buf = np.arange(numel, dtype=np.float64) * (t.rank + 1)
        ring_all_reduce(t, buf)
        ok &= np.array_equal(buf, np.arange(numel) * t.size * (t.size + 1) / 2)
    print(f"[rank {t.rank}/{t.size}] check: ring for 0..10 elements equals the sum: "
          f"{'OK' if ok else 'FAILED'}", flush=True)
    md.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    sys.exit(main())
