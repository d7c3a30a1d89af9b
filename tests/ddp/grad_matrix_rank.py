"""Every case of ddp_grad_matrix.py on real ranks: ``mpiexec -n 2 python <this>``.

Each rank runs every block with several buckets (MPI_BLOCKS; one bucket and one bucket per
parameter run on thread ranks only), checks its own gradients against the one-process oracle,
and rank 0 prints ``RESULT {"world_size": n, "cases": k, "problems": [...]}``
(test_ddp_grad_matrix.py reads it: one launch covers them all).
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ddp_grad_matrix import MPI_BLOCKS, SUBCASES, check_block, run_block  # noqa: E402

from minidist import comm  # noqa: E402


def main() -> None:
    comm.init_process_group()
    rank, world = comm.get_rank(), comm.get_world_size()
    problems = []
    for block in MPI_BLOCKS:
        problems += check_block(block, {rank: run_block(block, None, rank, world)}, world)
    every = comm.all_gather_object(problems)
    if rank == 0:
        cases = len(MPI_BLOCKS) * len(SUBCASES)
        print("RESULT " + json.dumps({"world_size": world, "cases": cases,
                                      "problems": [p for mine in every for p in mine]}))
    comm.destroy_process_group()


if __name__ == "__main__":
    main()
