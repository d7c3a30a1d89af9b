"""Ranks whose collectives do not match: every case must end, on every rank, with the ledger's
diagnosis naming the call number, the call on each side and the ranks that differ.

    MINIDIST_TIMEOUT_S=3 ./mpirun.sh -n 2 python tests/watch/mismatch_cases.py skip dtype op
    MINIDIST_TIMEOUT_S=3 ./mpirun.sh -n 2 python tests/watch/mismatch_cases.py --algorithm ring count
    RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 \\
        python tests/watch/mismatch_cases.py --tcp skip ...      # and RANK=1 beside it

Rank 1 is the odd one out in every case. Each case runs on a fresh process group (MPI: new
communicators; TCP: MASTER_PORT + case number) and ends with ``farewell`` + ``close``, what
``destroy_process_group`` does. Prints one line per case and rank:
``CASE <name> rank <r> <ErrorType>: <message>`` or ``CASE <name> rank <r> NO ERROR``.
``--uncaught CASE``: run one case through ``init_process_group`` without catching, so the job
ends through the excepthook (non-zero exit, every rank's message on stderr).
Cases: skip, extra, bcast, dtype, count, op, order, labelled (each one function below); ``die``: the last
rank exits in the middle (run it alone: it ends the job); ``slow``: rank 1 arrives long after
the deadline (the docs' example of a rank that does not answer).
"""

import argparse
import os
import sys
import time

import numpy as np

import minidist as md
from minidist.comm import CommError, ProcessGroup

N = 1024


def skip(g, r):
    """Rank 1 skips the first of two all-reduces."""
    a, b = np.ones(N, np.float32), np.ones(N, np.float32)
    if r != 1:
        g.all_reduce(a, algorithm=ALGO)
    g.all_reduce(b, algorithm=ALGO)


def extra(g, r):
    """Rank 1 calls one all-reduce more than the others."""
    g.all_reduce(np.ones(N, np.float32), algorithm=ALGO)
    if r == 1:
        g.all_reduce(np.ones(N, np.float32), algorithm=ALGO)


def bcast(g, r):
    """Rank 1 calls broadcast where the others call all_reduce."""
    x = np.ones(N, np.float32)
    if r == 1:
        g.broadcast(x, src=0)
    else:
        g.all_reduce(x, algorithm=ALGO)


def dtype(g, r):
    """Rank 1 passes int32 where the others pass float32: the same number of bytes."""
    g.all_reduce(np.ones(N, np.int32 if r == 1 else np.float32), algorithm=ALGO)


def count(g, r):
    """Rank 1 passes 1000 elements, the others 1024."""
    g.all_reduce(np.ones(1000 if r == 1 else N, np.float32), algorithm=ALGO)


def op(g, r):
    """Rank 1 reduces with max, the others with sum."""
    g.all_reduce(np.ones(N, np.float32), op="max" if r == 1 else "sum", algorithm=ALGO)


def order(g, r):
    """Rank 1 calls broadcast then all_reduce, the others the other way round."""
    x = np.ones(N, np.float32)
    if r == 1:
        g.broadcast(x, src=0)
        g.all_reduce(x, algorithm=ALGO)
    else:
        g.all_reduce(x, algorithm=ALGO)
        g.broadcast(x, src=0)


def die(g, r):
    """The last rank exits in the middle of an all-reduce; the others wait in it."""
    g.all_reduce(np.ones(N, np.float32), algorithm=ALGO)
    if r == g.size - 1:
        sys.stdout.flush()
        os._exit(3)  # no goodbye: a crash
    g.all_reduce(np.ones(N, np.float32), algorithm=ALGO)


def slow(g, r):
    """Rank 1 arrives in the same all-reduce long after the others' deadline (docs example)."""
    if r == 1:
        time.sleep(2.5 * float(os.environ.get("MINIDIST_TIMEOUT_S", "3")))
    g.all_reduce(np.ones(N, np.float32), algorithm=ALGO)


def labelled(g, r):
    """Rank 1 skips iteration 1 of a loop whose all-reduces carry the iteration as a label:
    caught at the call where the ranks part, not at the end."""
    for i in range(3):
        if r == 1 and i == 1:
            continue
        g.all_reduce(np.ones(N, np.float32), algorithm=ALGO, label=f"iteration {i}")


CASES = {f.__name__: f for f in (skip, extra, bcast, dtype, count, op, order, die, slow,
                                 labelled)}
ALGO = "auto"


def make_group(tcp: bool, i: int) -> ProcessGroup:
    timeout = float(os.environ.get("MINIDIST_TIMEOUT_S", "3"))
    if tcp:
        from minidist.tcp.transport import TCPTransport
        t = TCPTransport(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]),
                         os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]) + i, timeout)
    else:
        from minidist.comm.transports.mpi import MPITransport
        t = MPITransport(timeout_s=timeout)
    return ProcessGroup(t)


def main() -> None:
    global ALGO
    p = argparse.ArgumentParser()
    p.add_argument("cases", nargs="*")
    p.add_argument("--tcp", action="store_true")
    p.add_argument("--algorithm", default="auto")
    p.add_argument("--uncaught", default=None)
    a = p.parse_args()
    ALGO = a.algorithm
    if a.uncaught:  # the user's path: init, no try, the excepthook ends the job
        g = md.init_process_group()
        CASES[a.uncaught](g, g.rank)
        md.destroy_process_group()
        print(f"CASE {a.uncaught} rank {g.rank} NO ERROR", flush=True)
        return
    for i, name in enumerate(a.cases):
        g = make_group(a.tcp, i)
        try:
            CASES[name](g, g.rank)
            g.farewell()
            line = "NO ERROR"
        except CommError as e:
            line = f"{type(e).__name__}: {e}"
        # one write per line: ranks share the output pipe, and print() writes the newline apart
        sys.stdout.write(f"CASE {name} rank {g.rank} {line}\n")
        sys.stdout.flush()
        g.close()
    # mpiexec ends the job as soon as one rank exits unfinalized (unless run with
    # -disable-auto-cleanup, as the tests do): first wait until every rank has printed (not
    # with "die", where a rank is gone by design)
    if not a.tcp and "die" not in a.cases:
        from mpi4py import MPI
        req, deadline = MPI.COMM_WORLD.Ibarrier(), time.monotonic() + 30
        while not req.Test() and time.monotonic() < deadline:
            time.sleep(0.001)
    os._exit(0)  # a failed MPI call may still be pending: MPI_Finalize would wait for it


if __name__ == "__main__":
    main()
