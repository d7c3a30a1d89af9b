"""CUDA-IPC all-reduce on a real GPU: every rank's result equals the host reduction, bit for bit
on every rank, and equals the staged ring's; ``auto`` picks "cuda_ipc" for device buffers.

    mpiexec -n 2 python tests/cuda/cuda_ipc_rank.py    # two ranks sharing GPU 0 is fine
    MINIDIST_RANKS_PER_NODE=2 mpiexec -n 4 python tests/cuda/cuda_ipc_rank.py hier

``hier``: two virtual nodes of two ranks; "hier" runs its node phases over CUDA IPC and stages
only the cross-node phase; the result must equal the host reduction on every rank.
"""

import sys
import zlib
from pathlib import Path

import numpy as np

from minidist import comm
from minidist.fastpath.cuda_ipc import cuda_ipc_available
from minidist.comm.ops import reference_reduce
from minidist.xp import require_cuda

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/: the shared bound
from tolerances import sum_error_bound  # noqa: E402

cp = require_cuda()
comm.init_process_group(backend="mpi")
group = comm.get_default_group()
rank, world = comm.get_rank(), comm.get_world_size()
cp.cuda.Device(rank % cp.cuda.runtime.getDeviceCount()).use()

HIER = sys.argv[1:] == ["hier"]
for numel in (1, 1000, (1 << 18) + 3, 4 << 20):
    for dtype, op in ((np.float32, "sum"), (np.float32, "avg"), (np.float16, "sum"),
                      (np.int32, "max")):
        inputs = [(np.random.default_rng(r).standard_normal(numel) * 8).astype(dtype)
                  for r in range(world)]
        x = cp.asarray(inputs[rank])
        if HIER:
            group.all_reduce(x, op=op, algorithm="hier")
            got = cp.asnumpy(x)
            want = reference_reduce(inputs, op)
            if dtype == np.float16:  # another summation order: bounded by the partial sums
                err = np.abs(got.astype(np.float64) - want.astype(np.float64))
                bound = sum_error_bound(inputs, dtype)
                assert np.all(err <= bound), (numel, int(np.argmax(err - bound)))
            else:
                np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                                           rtol=1e-5, atol=1e-5)
            digest = np.array([zlib.crc32(got.tobytes())], np.int64)
            every = np.zeros(world, np.int64)
            every[rank] = digest[0]
            group.all_reduce(every)
            assert len(set(every.tolist())) == 1, every  # identical bits on every rank
            continue
        assert cuda_ipc_available(group.transport, x)
        group.all_reduce(x, op=op, algorithm="cuda_ipc")
        got = cp.asnumpy(x)
        want = reference_reduce(inputs, op)
        assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), (numel, dtype, op)
        y = cp.asarray(inputs[rank])
        group.all_reduce(y, op=op)  # auto: cuda_ipc again
        assert np.array_equal(cp.asnumpy(y).view(np.uint8), got.view(np.uint8))
        z = cp.asarray(inputs[rank])
        group.all_reduce(z, op=op, algorithm="ring")  # staged through host memory
        np.testing.assert_allclose(cp.asnumpy(z).astype(np.float64), want.astype(np.float64),
                                   rtol=1e-3 if dtype == np.float16 else 1e-6)
print(f"[rank {rank}] {'hier' if HIER else 'cuda_ipc'} ok", flush=True)
comm.destroy_process_group()
