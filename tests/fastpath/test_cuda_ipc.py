"""The "cuda_ipc" all-reduce without a GPU: its protocol on host windows, and its refusals.

``run_cuda_ipc`` takes any ``IpcState``; "ipc_host" (``ipc_state(t, "host")``) gives each thread
rank a NumPy window, and the ranks exchange "handles" (numbers naming the windows in a
registry, as CUDA IPC handles name device allocations) to map the peers' windows, as the GPU
version does. The header check, the phase flags (IN, RED, OUT), the launch plans, the copies,
the slice reductions in rank order and the double buffering all run as on the GPU; the host
is the stream. The kernel itself is tested under the simulator
(tests/cuda/train_kernels_cudasim_rank.py) and on a GPU by tests/cuda/test_cuda_ipc_gpu.py.
"""

import time

import numpy as np
import pytest

from minidist import comm
from minidist.comm.algorithms import ALGORITHMS
from minidist.fastpath.cuda_ipc import cuda_ipc_available
from minidist.fastpath.cuda_ipc import cuda_ipc_all_reduce, ipc_state, run_cuda_ipc
from minidist.comm.errors import CollectiveMismatch
from minidist.comm.ops import ReduceOp, reference_reduce
from minidist.comm.transports.threads import run_threads


def run(n, make_input, op, calls=2):
    def body(t):
        state = ipc_state(t, "host")
        outs = []
        for call in range(calls):
            x = make_input(t.rank, call)
            run_cuda_ipc(state, t, x, op, 0)
            outs.append((x, state.half))
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
        state = ipc_state(t, "host")
        x = np.ones(100 + t.rank, np.float32)
        with pytest.raises(CollectiveMismatch, match="cuda_ipc"):
            run_cuda_ipc(state, t, x, ReduceOp.SUM, 0)
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
    from minidist.fastpath.cuda_ipc import run_ipc_all_gather
    from minidist.comm.algorithms.ring import chunk_bounds

    numel = 1003
    bounds = chunk_bounds(numel, n)

    def body(t):
        state = ipc_state(t, "host")
        outs = []
        for call in range(3):
            x = np.full(numel, -1.0, np.float32)
            lo, hi = bounds[t.rank], bounds[t.rank + 1]
            x[lo:hi] = np.arange(lo, hi) + 1000 * call
            run_ipc_all_gather(state, t, x, bounds, 0)
            outs.append(x)
        return outs
    for outs in run_threads(n, body, timeout_s=60):
        for call, x in enumerate(outs):
            assert np.array_equal(x, np.arange(numel, dtype=np.float32) + 1000 * call)


def test_reduce_fallback_reference_is_rank_order():
    """What runs if the reduce kernel cannot compile here: the same rank-order reduction."""
    from minidist.fastpath.ipc_windows import reduce_reference

    rng = np.random.default_rng(3)
    for op in ("sum", "max", "min", "prod"):
        srcs = [rng.standard_normal(50).astype(np.float32) for _ in range(3)]
        srcs[1][4] = np.nan
        out = srcs[0]  # the rank's own window is one of the sources
        want = reference_reduce([s.copy() for s in srcs], op)
        reduce_reference(out, srcs, ReduceOp(op))
        assert np.array_equal(out.view(np.uint32), want.view(np.uint32)), op


def test_second_call_of_a_shape_builds_nothing_and_the_host_never_syncs():
    """Launch plans: one per window half; stream order: flags, no stream sync per call."""
    def body(t):
        state = ipc_state(t, "host")
        x = np.arange(1000, dtype=np.float32)
        for _ in range(2):  # one call per half: two plans
            run_cuda_ipc(state, t, x.copy(), ReduceOp.SUM, 0)
        w = state.windows
        built = (state.plans_built, w.views_built)
        stores = w.signals.stores
        for _ in range(6):
            y = x.copy()
            run_cuda_ipc(state, t, y, ReduceOp.SUM, 0)
            assert np.array_equal(y, x * t.size)
        return built, (state.plans_built, w.views_built), w.signals.stores - stores, w.syncs
    for built, after, stores, syncs in run_threads(3, body, timeout_s=60):
        assert built == (2, 2 * 3) and after == built  # 3 views (one per rank's slice) a plan
        assert stores == 6 * 3  # IN, RED, OUT per call
        assert syncs == 0


def test_flags_hold_a_fast_rank_until_a_slow_peer_has_copied_in():
    """Rank 1 copies in late; rank 0's reduce and copy-out must wait for its flags."""
    def body(t):
        state = ipc_state(t, "host")
        run_cuda_ipc(state, t, np.zeros(300, np.float32), ReduceOp.SUM, 0)  # windows made
        w = state.windows
        if t.rank == 1:
            memcpy = w.memcpy

            def slow(dst, src, nbytes):
                time.sleep(0.05)
                memcpy(dst, src, nbytes)
            w.memcpy = slow
        outs = []
        for call in range(3):
            x = np.full(300, float(10 * call + t.rank + 1), np.float32)
            run_cuda_ipc(state, t, x, ReduceOp.SUM, 0)
            outs.append(x)
        return outs
    for outs in run_threads(2, body, timeout_s=60):
        for call, x in enumerate(outs):
            assert np.all(x == (10 * call + 1) + (10 * call + 2)), (call, x[:4])


def test_windows_grow_together_and_ipc_host_runs_through_the_group():
    def body(t):
        group = comm.new_group_from_transport(t)
        got = []
        for numel in (10, 300_000, 7, 600_000):  # 1.2 and 2.4 MB: the windows grow twice
            x = np.arange(numel, dtype=np.float32) + t.rank
            group.all_reduce(x, op="avg", algorithm="ipc_host")
            got.append(bool(np.array_equal(x, np.arange(numel, dtype=np.float32) + 0.5)))
        with pytest.raises(ValueError, match=r"ipc_host.*needs a host \(NumPy\) array"):
            group.all_reduce(_NotNumpy(), algorithm="ipc_host")
        group.close()
        return got
    assert run_threads(2, body, timeout_s=60) == [[True] * 4] * 2


class _NotNumpy(np.ndarray):
    """A NumPy subclass (not exactly ndarray): refused like a foreign array."""

    def __new__(cls):
        return np.zeros(4, np.float32).view(cls)
