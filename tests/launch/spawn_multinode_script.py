"""imagenet's multi-node spawn mode on one machine: this process is one "node" (its RANK from
the test), spawns one worker, and the worker calls ``init_process_group`` with the rank and
world size the script computes (node rank * workers per node + worker; nodes * workers), which
differ from what spawn set (rank 0 of 1). Prints "node N ok" after an all-reduce over both."""

import os

import numpy as np

import minidist
import minidist.distributed as dist
import minidist.multiprocessing as mp


def main_worker(gpu, node_rank, nodes, port):
    rank = node_rank * 1 + gpu
    dist.init_process_group(backend="gloo", init_method=f"tcp://127.0.0.1:{port}",
                            world_size=nodes * 1, rank=rank)
    assert (dist.get_rank(), dist.get_world_size()) == (rank, nodes)
    t = minidist.ones(2)
    dist.all_reduce(t)
    np.testing.assert_array_equal(t.data, nodes)
    print(f"node {node_rank} ok", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    node, nodes, port = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "MASTER_PORT"))
    mp.spawn(main_worker, args=(node, nodes, port), nprocs=1)
