"""One rank of a TCP test job: build a TCPTransport from torchrun-style env vars, run a mode.

    RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 \
        python tests/tcp/tcp_rank.py p2p

Modes: ``p2p`` (tags, out-of-order receives, a ring of large sendrecv, self-send), ``allreduce``
(every registered algorithm over TCP vs the NumPy oracle), ``die`` (the last rank exits
mid-collective; the others must raise CommError naming it), ``connect`` (just rendezvous),
``threads`` (two threads of each rank exchange at once on their own tags: whichever waits reads
the sockets for both), ``mismatch`` (a message larger than the posted receive fails that
receive, and the stream stays in sync).
Prints ``OK <mode>`` on success; errors propagate as a non-zero exit with the message on stderr.
"""

import os
import sys
import time

import numpy as np

from minidist.comm.errors import CommError
from minidist.tcp.transport import TCPTransport


def make() -> TCPTransport:
    return TCPTransport(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]),
                        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                        timeout_s=float(os.environ.get("MINIDIST_TIMEOUT_S", "10")))


def p2p(t: TCPTransport) -> None:
    r, n = t.rank, t.size
    right, left = (r + 1) % n, (r - 1) % n
    # A ring of large sendrecv (8 MiB each way) must not deadlock.
    big = np.full(2 << 20, r, dtype=np.float32)
    got = np.empty_like(big)
    t.sendrecv(big, right, got, left)
    assert (got == left).all(), (r, got[:4])
    # Tags separate streams: send tag 2 then tag 1; receive tag 1 first.
    a, b = np.arange(5, dtype=np.int64) + r, np.arange(7, dtype=np.float64) * r
    t.send(a, right, tag=2)
    t.send(b, right, tag=1)
    rb, ra = np.empty(7), np.empty(5, dtype=np.int64)
    t.recv(rb, left, tag=1)
    t.recv(ra, left, tag=2)
    assert (ra == np.arange(5) + left).all() and (rb == np.arange(7) * left).all()
    # Order within one (peer, tag) stream; zero-byte messages; irecv posted before the send.
    reqs = [t.irecv(np.empty(3, dtype=np.int32), left, tag=5) for _ in range(3)]
    for i in range(3):
        t.send(np.full(3, 10 * r + i, dtype=np.int32), right, tag=5)
    t.sendrecv(np.empty(0, np.float32), right, np.empty(0, np.float32), left, tag=9)
    for i, q in enumerate(reqs):
        q.wait()
        assert q.test()
    # Self-send: through the inbox (send first) or straight into a posted recv (recv first).
    me = np.empty(4)
    t.send(np.arange(4.0), r, tag=3)
    t.recv(me, r, tag=3)
    assert (me == np.arange(4.0)).all()
    q = t.irecv(me, r, tag=4)
    t.send(np.arange(4.0) + 1, r, tag=4)
    q.wait()
    assert (me == np.arange(4.0) + 1).all()


def allreduce(t: TCPTransport) -> None:
    from minidist.comm import algorithms
    from minidist.comm.ops import ReduceOp, reference_reduce

    names = [a for a in os.environ.get("ALGOS", "ring,tree,rd,direct").split(",") if a]
    r, n = t.rank, t.size
    for numel in (0, 1, n - 1, n + 1, 1027, 300_000):
        for dtype, op in ((np.float32, ReduceOp.SUM), (np.int64, ReduceOp.MAX),
                          (np.float64, ReduceOp.AVG)):
            world = np.random.default_rng(numel).normal(size=(n, numel)) * 100
            world = world.astype(dtype)
            expected = reference_reduce(list(world), op)
            for name in names:
                buf = world[r].copy()
                algorithms.ALGORITHMS[name](t, buf, op)
                if dtype is np.float32 and name != "direct":
                    ok = np.allclose(buf, expected, rtol=1e-5, atol=1e-3)
                else:
                    ok = (buf == expected).all() if dtype is np.int64 else np.allclose(buf, expected)
                if not ok:
                    raise SystemExit(f"[rank {r}/{n}] {name} numel={numel} {np.dtype(dtype).name} "
                                     f"{op}: wrong result {buf[:4]} vs {expected[:4]}")


def die(t: TCPTransport) -> None:
    if t.rank == t.size - 1:
        os._exit(3)  # a crash: no close(), no goodbye
    buf = np.ones(1000, dtype=np.float32)
    try:
        t.recv(buf, t.size - 1)
    except CommError as e:
        assert f"rank {t.size - 1}" in str(e), str(e)
        print(f"CAUGHT {e}", flush=True)
        return
    raise SystemExit("recv from a dead rank returned")


def threads(t: TCPTransport) -> None:
    import threading

    r, n = t.rank, t.size
    right, left = (r + 1) % n, (r - 1) % n
    errors = []

    def exchange(tag: int, numel: int) -> None:
        try:
            for i in range(30):
                out = np.full(numel, 1000 * r + 10 * tag + i, dtype=np.int64)
                got = np.empty_like(out)
                t.sendrecv(out, right, got, left, tag=tag)
                assert (got == 1000 * left + 10 * tag + i).all(), (tag, i, got[:3])
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    workers = [threading.Thread(target=exchange, args=(tag, numel))
               for tag, numel in ((1, 3), (2, 1 << 18))]  # 8 B x 3 and 2 MiB messages
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=60)
    assert not errors and not any(w.is_alive() for w in workers), errors


def mismatch(t: TCPTransport) -> None:
    r, n = t.rank, t.size
    right, left = (r + 1) % n, (r - 1) % n
    for numel in (10, 100_000):  # staged, and big enough to be drained past the staging buffer
        t.send(np.ones(numel, dtype=np.float32), right, tag=7)
        try:
            t.recv(np.empty(numel // 2, dtype=np.float32), left, tag=7)
        except CommError as e:
            assert f"rank {left} sent {4 * numel} bytes" in str(e), str(e)
        else:
            raise SystemExit("a too-large message filled a smaller receive")
        t.send(np.arange(5.0) + r, right, tag=8)  # the stream is still in sync
        got = np.empty(5)
        t.recv(got, left, tag=8)
        assert (got == np.arange(5.0) + left).all(), got


if __name__ == "__main__":
    mode = sys.argv[1]
    t0 = time.perf_counter()
    t = make()
    try:
        if mode != "connect":
            globals()[mode](t)
    finally:
        t.close()
        t.close()  # idempotent
    print(f"OK {mode} rank {t.rank} {time.perf_counter() - t0:.2f}s", flush=True)
