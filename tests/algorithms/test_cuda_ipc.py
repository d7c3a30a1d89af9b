"""The "cuda_ipc" all-reduce without a GPU: its structure on host "windows", and its refusals.

``run_cuda_ipc`` takes any ``Windows``; here each thread rank allocates a NumPy window, the
ranks all-gather their "handles" (a number naming the window in a registry, as CUDA IPC
handles name device allocations) over the transport and open the peers' windows by handle, as
the GPU version does. Copy-in, barrier, slice reductions in rank order, barrier, copy-out, the
header check and the double buffering all run as on the GPU. The kernel itself is tested
under the simulator (tests/cuda/train_kernels_cudasim_body.py) and on a GPU by
tests/cuda/test_cuda_ipc_gpu.py.
"""

import itertools
import threading

import numpy as np
import pytest

from minidist import comm
from minidist.comm.algorithms import ALGORITHMS, cuda_ipc_available
from minidist.comm.algorithms.cuda_ipc import _grow, cuda_ipc_all_reduce, run_cuda_ipc
from minidist.comm.algorithms.ring import ring_all_gather
from minidist.comm.errors import CollectiveMismatch
from minidist.comm.ops import ReduceOp, combine, reference_reduce
from minidist.comm.transports.threads import run_threads

_REGISTRY: dict = {}  # handle -> window: the host stand-in for cudaIpcOpenMemHandle
_NEXT = itertools.count(1)
_LOCK = threading.Lock()


class HostWindows:
    """``Windows`` on host memory for thread ranks, with a handle exchange like CUDA IPC's."""

    def __init__(self, transport, half_bytes):
        self.half_bytes, self.half = half_bytes, 0
        own = np.zeros(2 * half_bytes, np.uint8)
        with _LOCK:
            handle = next(_NEXT)
            _REGISTRY[handle] = own
        handles = np.zeros(transport.size, np.int64)
        handles[transport.rank] = handle
        ring_all_gather(transport, handles, 0)
        self.windows = [own if j == transport.rank else _REGISTRY[int(h)]
                        for j, h in enumerate(handles)]
        self.syncs = 0

    def slots(self, half, dtype, numel):
        lo = half * self.half_bytes
        return [w[lo:lo + numel * np.dtype(dtype).itemsize].view(dtype) for w in self.windows]

    def copy(self, dst, src):
        dst[...] = src

    def reduce(self, out, sources, op):
        acc = np.array(sources[0], copy=True)
        for s in sources[1:]:
            combine(acc, s, op)
        out[...] = acc

    def sync(self):
        self.syncs += 1

    def close(self):
        self.windows = []


def run(n, make_input, op, calls=2):
    def body(t):
        windows = None
        outs = []
        for call in range(calls):
            x = make_input(t.rank, call)
            windows = _grow(windows, x.nbytes, lambda half: HostWindows(t, half))
            run_cuda_ipc(windows, t, x, op, 0)
            outs.append((x, windows.half))
        return outs
    return run_threads(n, body, timeout_s=60)


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("numel", [1, 5, 1000, 4099])
@pytest.mark.parametrize("dtype,op", [(np.float32, "sum"), (np.float32, "avg"),
                                      (np.float16, "sum"), (np.int32, "max"),
                                      (np.float64, "min"), (np.float32, "prod")])
def test_host_twin_equals_rank_order_reduce_on_every_rank(n, numel, dtype, op):
    def make(rank, call):
        rng = np.random.default_rng(100 * rank + call)
        return (rng.standard_normal(numel) * 8).astype(dtype)
    out = run(n, make, ReduceOp(op))
    for call in range(2):
        want = reference_reduce([make(r, call) for r in range(n)], op)
        for r in range(n):
            got, half = out[r][call]
            assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), (r, call)
            assert half == (call + 1) % 2  # double buffering alternates halves


def test_nan_and_inf_propagate_like_the_reference():
    def make(rank, call):
        x = np.arange(200, dtype=np.float32)
        x[rank * 7] = np.nan
        x[150 + rank] = np.inf
        return x
    out = run(3, make, ReduceOp.SUM, calls=1)
    want = reference_reduce([make(r, 0) for r in range(3)], "sum")
    for r in range(3):
        np.testing.assert_array_equal(out[r][0][0], want)


def test_mismatched_numel_raises_on_every_rank():
    def body(t):
        windows = HostWindows(t, 1 << 16)
        x = np.ones(100 + t.rank, np.float32)
        with pytest.raises(CollectiveMismatch, match="cuda_ipc"):
            run_cuda_ipc(windows, t, x, ReduceOp.SUM, 0)
        return True
    assert run_threads(2, body, timeout_s=60) == [True, True]


def test_refuses_host_buffers_and_one_process_worlds():
    assert "cuda_ipc" in ALGORITHMS

    def body(t):
        x = np.ones(10, np.float32)
        assert not cuda_ipc_available(t, x)
        with pytest.raises(ValueError, match=r"needs a device \(CuPy\) array.*algorithm='shm'"):
            cuda_ipc_all_reduce(t, x, ReduceOp.SUM)
        group = comm.new_group_from_transport(t)
        with pytest.raises(ValueError, match="cuda_ipc"):
            group.all_reduce(x, algorithm="cuda_ipc")
        group.all_reduce(x)  # auto never picks cuda_ipc for a host array
        return x.tolist()
    assert run_threads(2, body, timeout_s=60) == [[2.0] * 10] * 2


@pytest.mark.parametrize("n", [2, 3])
def test_host_twin_all_gather_of_regions(n):
    """hier's node phase (3): every rank's region lands in every rank's buffer."""
    from minidist.comm.algorithms.cuda_ipc import run_ipc_all_gather
    from minidist.comm.algorithms.ring import chunk_bounds

    numel = 1003
    bounds = chunk_bounds(numel, n)

    def body(t):
        windows = HostWindows(t, 1 << 14)
        outs = []
        for call in range(3):
            x = np.full(numel, -1.0, np.float32)
            lo, hi = bounds[t.rank], bounds[t.rank + 1]
            x[lo:hi] = np.arange(lo, hi) + 1000 * call
            run_ipc_all_gather(windows, t, x, bounds, 0)
            outs.append(x)
        return outs
    for outs in run_threads(n, body, timeout_s=60):
        for call, x in enumerate(outs):
            assert np.array_equal(x, np.arange(numel, dtype=np.float32) + 1000 * call)


def test_reduce_fallback_reference_is_rank_order():
    """What runs if the reduce kernel cannot compile here: the same rank-order reduction."""
    from minidist.comm.algorithms.cuda_ipc import _reduce_reference

    rng = np.random.default_rng(3)
    for op in ("sum", "max", "min", "prod"):
        srcs = [rng.standard_normal(50).astype(np.float32) for _ in range(3)]
        srcs[1][4] = np.nan
        out = srcs[0]  # the rank's own window is one of the sources
        want = reference_reduce([s.copy() for s in srcs], op)
        _reduce_reference(out, srcs, op)
        assert np.array_equal(out.view(np.uint32), want.view(np.uint32)), op
