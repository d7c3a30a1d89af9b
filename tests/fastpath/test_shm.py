"""The shared-memory all-reduce under real mpiexec ranks (tests/fastpath/shm_rank.py)."""

import numpy as np
import pytest

from procs import REPO, run_mpi

BODY = REPO / "tests" / "fastpath" / "shm_rank.py"


@pytest.mark.mpi
@pytest.mark.parametrize("n,knobs", [
    (1, {}), (2, {}), (3, {}),
    (2, {"MINIDIST_SHM_CHUNK_BYTES": "4096"}),  # tiny chunks: the double buffer flips a lot
    (3, {"MINIDIST_SHM_CHUNK_BYTES": "4096"}),
    (3, {"MINIDIST_SHM_SMALL_BYTES": "0"}),     # small messages take the sliced path too
])
def test_shm_all_reduce_bit_identical(n, knobs):
    env = {"MINIDIST_TIMEOUT_S": "20", **knobs}
    res = run_mpi(n, [BODY], timeout_s=90, env=env)
    assert res.returncode == 0, res.report()
    assert res.stdout.count("OK shm") == n, res.report()


def test_shm_refuses_a_transport_without_mpi():
    from minidist.fastpath.shm import shm_all_reduce
    from minidist.comm.errors import CommError
    from minidist.comm.ops import ReduceOp
    from minidist.comm.transports.threads import run_threads

    def body(t):
        with pytest.raises(CommError, match="needs the MPI transport"):
            shm_all_reduce(t, np.ones(4, np.float32), ReduceOp.SUM)

    run_threads(2, body, timeout_s=30)
