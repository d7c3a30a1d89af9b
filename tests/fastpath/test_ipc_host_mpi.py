"""The "cuda_ipc" protocol between real processes, on host windows in MPI shared memory
(rank body: tests/fastpath/ipc_host_rank.py): the CPU twin of tests/cuda/test_cuda_ipc_gpu.py."""

import pytest

from procs import run_mpi


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
def test_ipc_host_under_mpiexec(n):
    res = run_mpi(n, ["tests/fastpath/ipc_host_rank.py"], timeout_s=120,
                  env={"MINIDIST_TIMEOUT_S": "30"})
    assert res.returncode == 0, res.report()
    assert res.stdout.count("ipc_host ok") == n, res.report()
