"""The "cuda_ipc" all-reduce on a real GPU, two MPI ranks (sharing one GPU works). Skipped
without CuPy and a GPU. CPU twins: tests/fastpath/test_cuda_ipc.py (the algorithm on host
windows) and tests/cuda/train_kernels_cudasim_rank.py (the reduce kernel in the simulator)."""

import pytest

from minidist import xp as backend
from procs import REPO, run_mpi

pytestmark = pytest.mark.gpu


def test_cuda_ipc_two_ranks():
    if not backend.gpu_available():
        pytest.skip("no CuPy or no CUDA GPU")
    res = run_mpi(2, [REPO / "tests" / "cuda" / "cuda_ipc_rank.py"], timeout_s=300)
    assert res.returncode == 0, res.report()
    assert res.stdout.count("cuda_ipc ok") == 2, res.report()


def test_hier_node_phases_over_cuda_ipc_four_ranks():
    if not backend.gpu_available():
        pytest.skip("no CuPy or no CUDA GPU")
    res = run_mpi(4, [REPO / "tests" / "cuda" / "cuda_ipc_rank.py", "hier"],
                  timeout_s=300, env={"MINIDIST_RANKS_PER_NODE": "2"})
    assert res.returncode == 0, res.report()
    assert res.stdout.count("hier ok") == 4, res.report()
