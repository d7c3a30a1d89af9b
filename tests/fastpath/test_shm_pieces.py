"""The shm all-reduce with small reduce-and-push pieces (MINIDIST_SHM_PIECE_BYTES), mpiexec.

Small pieces make every message of tests/fastpath/shm_rank.py run through many
reduce-and-push pieces, on plain and on shared (zero-copy) buffers; the
body checks bit-identical results on every rank for every dtype and op. Float sums and
averages take the one-pass kernel (kernels/reduce_cpu.py) unless MINIDIST_KERNELS=reference.
"""

import pytest

from procs import REPO, run_mpi

BODY = REPO / "tests" / "fastpath" / "shm_rank.py"


@pytest.mark.mpi
@pytest.mark.parametrize("n,knobs", [
    (2, {"MINIDIST_SHM_PIECE_BYTES": "4096"}),
    (2, {"MINIDIST_SHM_PIECE_BYTES": "4096", "MINIDIST_KERNELS": "reference"}),  # sums too
    (3, {"MINIDIST_SHM_PIECE_BYTES": "1000", "MINIDIST_SHM_SMALL_BYTES": "0"}),  # odd piece size
    (3, {"MINIDIST_SHM_PIECE_BYTES": "8192", "MINIDIST_SHM_CHUNK_BYTES": "20000"}),
])
def test_shm_pieces_bit_identical(n, knobs):
    env = {"MINIDIST_TIMEOUT_S": "20", **knobs}
    res = run_mpi(n, [BODY], timeout_s=90, env=env)
    assert res.returncode == 0, res.report()
    assert res.stdout.count("OK shm") == n, res.report()
