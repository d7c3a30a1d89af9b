"""Staged all-reduce of CuPy buffers on a real GPU (pinned buffers, copy streams), against the
host all-reduce of the same data. Skipped without CuPy and a GPU.

CPU twin: tests/fastpath/test_staging.py (the same pipeline over a stand-in device whose copy
queues run only when waited for). The DDP check (two MPI ranks sharing one GPU, device
buckets equal the host run) is ddp_device_rank.py, run here under mpiexec and in CI
on the CPU.
"""

import numpy as np
import pytest

from minidist import comm
from minidist import xp as backend
from minidist.comm.algorithms.ring import ring_all_reduce
from minidist.comm.ops import ReduceOp
from minidist.fastpath.staging import CupyCopies, Stager, stager_for
from minidist.comm.transports.threads import run_threads

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cp():
    if not backend.gpu_available():
        pytest.skip("no CuPy or no CUDA GPU")
    import cupy

    return cupy


@pytest.mark.parametrize("numel", [1, 1001, (1 << 18) + 3, 4 << 20])
def test_staged_ring_equals_host_ring(cp, numel):
    def body(t):
        host = (np.random.default_rng(t.rank).standard_normal(numel) * 10).astype(np.float32)
        dev = cp.asarray(host)
        stager = Stager(CupyCopies())
        stager.all_reduce(dev, lambda chunk: ring_all_reduce(t, chunk, ReduceOp.SUM, 0))
        ring_all_reduce(t, host, ReduceOp.SUM, 0)
        return cp.asnumpy(dev), host
    for got, want in run_threads(2, body, timeout_s=120):
        assert np.array_equal(got, want)


def test_group_all_reduce_of_device_buffers_is_staged(cp):
    def body(t):
        group = comm.new_group_from_transport(t)
        x = cp.arange(3_000_001, dtype=cp.float32) * (t.rank + 1)
        assert stager_for(t, x) is not None
        group.all_reduce(x, op="avg")
        return cp.asnumpy(x)
    a, b = run_threads(2, body, timeout_s=120)
    want = np.arange(3_000_001, dtype=np.float32) * 1.5
    assert np.array_equal(a, b) and np.allclose(a, want, rtol=1e-6)


def test_ddp_on_device_equals_host_two_mpi_ranks_one_gpu(cp):
    from procs import REPO, run_mpi

    res = run_mpi(2, [REPO / "tests" / "cuda" / "ddp_device_rank.py", "cuda"],
                  timeout_s=240)
    assert res.returncode == 0, res.report()
    assert res.stdout.count("ddp device == host ok") == 2, res.report()
