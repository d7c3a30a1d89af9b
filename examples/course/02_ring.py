"""Step 2: the ring all-reduce, written out: a reduce-scatter, then an all-gather.

    ./mpirun.sh -n 3 python examples/course/02_ring.py              # per-step prints, 6 numbers
    ./mpirun.sh -n 2 python examples/course/02_ring.py --numel 4194304

The buffer is cut into n chunks. At every step each rank sends one chunk to its right
neighbour and receives one from its left, so all links are busy at once:

    reduce-scatter, s = 0..n-2: send chunk (r-s)%n, receive chunk (r-s-1)%n and ADD it
    all-gather,     s = 0..n-2: send chunk (r-s+1)%n, receive chunk (r-s)%n and COPY it

After the reduce-scatter rank r owns the full sum of chunk (r+1)%n; the all-gather passes
the finished chunks once around. Per rank 2(n-1) messages of K/n bytes, so the bytes sent,
2K(n-1)/n, hardly grow with n, where step 1's naive version sends (n-1)K.
(The library's version is minidist/comm/algorithms/ring.py; docs/algorithms.md has its picture.)
"""

import argparse
import sys
import time

import numpy as np

import minidist as md


def ring_all_reduce(t, buf, verbose=False):
    n, r = t.size, t.rank
    if buf.size % n:
        raise ValueError(f"[rank {r}/{n}] ring_all_reduce: {buf.size} elements do not split into "
                         f"{n} equal chunks. Pad the buffer (exercise 2.1 lifts this limit).")
    chunks = buf.reshape(n, -1)  # chunk c is the view chunks[c]
    right, left = (r + 1) % n, (r - 1) % n
    incoming = np.empty_like(chunks[0])
    log = []
    for s in range(n - 1):  # reduce-scatter
        send_c, recv_c = (r - s) % n, (r - s - 1) % n
        t.sendrecv(chunks[send_c], right, incoming, left)
        chunks[recv_c] += incoming
        if verbose:  # (tolist() of a big chunk would cost more than the ring itself)
            log.append(f"reduce-scatter step {s}: sent c{send_c} to {right}, added c{recv_c} "
                       f"from {left} -> {chunks[recv_c].tolist()}")
    for s in range(n - 1):  # all-gather
        send_c, recv_c = (r - s + 1) % n, (r - s) % n
        t.sendrecv(chunks[send_c], right, chunks[recv_c], left)
        if verbose:
            log.append(f"all-gather     step {s}: sent c{send_c} to {right}, copied c{recv_c} "
                       f"from {left} -> {chunks[recv_c].tolist()}")
    if verbose:
        print("\n".join(f"[rank {r}/{n}] {line}" for line in log), flush=True)


def timed(fn, t, world, repeats):
    buf = world[t.rank].copy()
    times = []
    for _ in range(repeats):
        buf[:] = world[t.rank]
        t0 = time.perf_counter()
        fn(t, buf)
        times.append(time.perf_counter() - t0)
    return float(np.median(times)), buf


def naive_all_reduce(t, buf):  # step 1's, for the comparison
    n, r = t.size, t.rank
    rows = np.empty((n, buf.size), buf.dtype)
    rows[r] = buf
    for s in range(1, n):
        t.sendrecv(buf, (r + s) % n, rows[(r - s) % n], (r - s) % n)
    buf[:] = rows.sum(axis=0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--numel", type=int, default=None, help="elements (default: 2 per rank)")
    ap.add_argument("--quick", action="store_true", help="few repeats (tests)")
    args = ap.parse_args()
    t = md.init_process_group().transport
    n, r = t.size, t.rank

    # 1) a tiny buffer, every step printed: rank r holds [r+1, r+1, ...]
    small = np.full(2 * n, r + 1, np.float32)
    ring_all_reduce(t, small, verbose=True)
    ok_small = np.all(small == n * (n + 1) / 2)

    # 2) a large one, timed against step 1's naive all-reduce
    numel = args.numel or (1 << 12 if args.quick else 1 << 21)
    numel -= numel % n
    world = np.random.default_rng(0).normal(size=(n, numel)).astype(np.float32)
    repeats = 3 if args.quick else 20
    t_ring, got = timed(ring_all_reduce, t, world, repeats)
    t_naive, _ = timed(naive_all_reduce, t, world, repeats)
    k = 4 * numel
    if r == 0:
        print(f"n={n}, K={k} B: ring {t_ring * 1e3:.2f} ms ({2 * (n - 1)} messages, "
              f"{2 * k * (n - 1) // n} B sent per rank), naive {t_naive * 1e3:.2f} ms "
              f"({n - 1} messages, {(n - 1) * k} B per rank)")
    # the ring adds in another order than numpy, so compare with a tolerance
    ok = ok_small and np.allclose(got, world.sum(axis=0), rtol=1e-5, atol=1e-5)
    print(f"[rank {r}/{n}] check: ring result equals numpy sum: {'OK' if ok else 'FAILED'}",
          flush=True)
    md.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
