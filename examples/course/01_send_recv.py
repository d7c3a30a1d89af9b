"""Step 1: messages between ranks, and the naive all-reduce built from them.

    ./mpirun.sh -n 2 python examples/course/01_send_recv.py
    ./mpirun.sh -n 3 python examples/course/01_send_recv.py --numel 1000000

Every rank is a separate process running this same file. The only thing they share is the
transport: ``t.send(buf, dst)`` and ``t.recv(buf, src)`` move the bytes of a NumPy array.
We measure the two numbers every cost in this course is made of:

    alpha  (latency)    seconds for an empty message: half a ping-pong of 8 bytes
    beta   (1/bandwidth) seconds per byte: from a ping-pong of a large array

Then the naive all-reduce: every rank sends its whole buffer (K bytes) to every other rank
and sums what arrives. Per rank that is (n-1) messages of K bytes: time ~ (n-1)(alpha + K beta).
"""

import argparse
import sys
import time

import numpy as np

import minidist as md


def ping_pong(t, nbytes, repeats):
    """Median round-trip seconds of ``nbytes`` between rank 0 and rank 1 (others idle)."""
    buf = np.zeros(max(nbytes // 4, 1), np.float32)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        if t.rank == 0:
            t.send(buf, 1)
            t.recv(buf, 1)
        elif t.rank == 1:
            t.recv(buf, 0)
            t.send(buf, 0)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def naive_all_reduce(t, buf):
    """Everyone sends everything to everyone; every rank then adds the rows in rank order."""
    n, r = t.size, t.rank
    rows = np.empty((n, buf.size), buf.dtype)
    rows[r] = buf
    for s in range(1, n):  # step s: send to r+s, receive from r-s (a pairing with no deadlock)
        t.sendrecv(buf, (r + s) % n, rows[(r - s) % n], (r - s) % n)
    buf[:] = rows.sum(axis=0)  # same order on every rank -> the same bits everywhere


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--numel", type=int, default=1 << 18, help="float32 elements per rank")
    ap.add_argument("--quick", action="store_true", help="few repeats (tests)")
    args = ap.parse_args()
    group = md.init_process_group()
    t = group.transport  # minidist's point-to-point transport (MPI under mpirun.sh)
    n, r = t.size, t.rank
    repeats = 3 if args.quick else 50

    if n >= 2:
        small, large = 8, 4 * args.numel
        alpha = ping_pong(t, small, repeats) / 2
        beta = max(ping_pong(t, large, repeats) / 2 - alpha, 0.0) / large
        if r == 0:
            print(f"ping-pong: alpha = {alpha * 1e6:.1f} us per message, "
                  f"beta = {beta * 1e9:.3f} ns per byte ({1e-9 / max(beta, 1e-15):.2f} GB/s)")

    # Every rank builds the same world array and takes its own row, so every rank can also
    # compute the expected answer by itself.
    world = np.random.default_rng(0).normal(size=(n, args.numel)).astype(np.float32)
    buf = world[r].copy()
    times = []
    for _ in range(repeats):
        buf[:] = world[r]
        t0 = time.perf_counter()
        naive_all_reduce(t, buf)
        times.append(time.perf_counter() - t0)
    k = buf.nbytes
    if r == 0:
        print(f"naive all-reduce, n={n}, K={k} B: {np.median(times) * 1e3:.2f} ms "
              f"(per rank {n - 1} messages, {(n - 1) * k} B sent)")
        if n >= 2:
            print(f"model (n-1)(alpha + K beta) = {(n - 1) * (alpha + k * beta) * 1e3:.2f} ms")
    ok = np.array_equal(buf, world.sum(axis=0))
    print(f"[rank {r}/{n}] check: naive all-reduce equals numpy sum: {'OK' if ok else 'FAILED'}",
          flush=True)
    md.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
