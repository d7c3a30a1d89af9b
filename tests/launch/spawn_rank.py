"""Jobs for the spawn and init_process_group tests; run as a script, prints what it saw.

    python tests/launch/spawn_rank.py ok|raise|explicit     # minidist.multiprocessing.spawn
    mpiexec -n 2 python tests/launch/spawn_rank.py mpi_env  # RANK etc. exported under mpiexec
"""

import os
import socket
import sys

import numpy as np

import minidist as md
import minidist.multiprocessing as mp


def reduce_ranks(rank: int, world: int) -> None:
    x = np.array([float(rank + 1)])
    md.all_reduce(x)
    assert x[0] == world * (world + 1) / 2, (rank, x)


def worker_env(rank: int, world: int) -> None:
    g = md.init_process_group()
    assert (g.rank, g.size, g.backend) == (rank, world, "tcp"), (g.rank, g.size, g.backend)
    assert os.environ["LOCAL_RANK"] == str(rank) and os.environ["OMP_NUM_THREADS"] == "1"
    reduce_ranks(rank, world)
    md.destroy_process_group()


def worker_raise(rank: int, world: int) -> None:
    md.init_process_group(backend="gloo")
    if rank == 1:
        raise ValueError("rank one is broken")
    md.barrier()  # rank 0 waits here until spawn stops it


def worker_explicit(rank: int, world: int, port: int) -> None:
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        del os.environ[k]  # as in a torch script that passes everything explicitly
    md.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                          world_size=world)
    reduce_ranks(rank, world)
    md.destroy_process_group()


def reserved_port() -> socket.socket:
    """A socket holding a free port (SO_REUSEADDR, never listening) until it is closed: rank
    0's rendezvous can still bind it, other programs cannot take it meanwhile."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    return s


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "ok":
        mp.spawn(worker_env, args=(2,), nprocs=2)
        print("SPAWN OK")
    elif mode == "explicit":
        with reserved_port() as held:
            mp.spawn(worker_explicit, args=(2, held.getsockname()[1]), nprocs=2)
        print("SPAWN OK")
    elif mode == "raise":
        try:
            mp.spawn(worker_raise, args=(2,), nprocs=2)
        except mp.ProcessRaisedException as e:
            print(f"RAISED index={e.error_index}\n{e}")
            sys.exit(7)
    elif mode == "mpi_env":
        backend = sys.argv[2] if len(sys.argv) > 2 else None
        g = md.init_process_group(backend)
        print(f"ENV rank={g.rank} backend={g.backend} RANK={os.environ['RANK']} "
              f"LOCAL_RANK={os.environ['LOCAL_RANK']} WORLD_SIZE={os.environ['WORLD_SIZE']}")
        reduce_ranks(g.rank, g.size)
        md.destroy_process_group()
