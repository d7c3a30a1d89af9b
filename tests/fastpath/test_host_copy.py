""""host_copy" (small device all-reduces: copy down, host all-reduce, copy up) without a GPU,
and how "auto" picks it: only below a cut-over that a calibration measured.

The algorithm runs on thread ranks with a stand-in for the device side whose copy up is
queued on a stand-in stream and runs only at the next copy down (or ``sync``), as on a GPU:
reading the buffer before then sees the old values, and a second call on the same buffer
must see the first one's result. On a GPU: tests/cuda/test_cuda_ipc_gpu.py.
"""

import numpy as np
import pytest

from minidist.comm.algorithms import ALGORITHMS
from minidist.auto.calibrate import Calibration, fit, validate, cache_key, FORMAT
from minidist.fastpath.host_copy import choose_device, host_copy_all_reduce, run_host_copy
from minidist.comm.ops import ReduceOp
from minidist.comm.transports.threads import run_threads


class StandInCopies:
    """``HostCopies`` on host arrays; the copy up waits on a stand-in stream."""

    def __init__(self):
        self.queued, self.pinned_made = [], 0

    def pinned(self, numel, dtype):
        self.pinned_made += 1
        return np.full(numel, -7, dtype)

    def down(self, device_buf, host):
        self.sync()  # the stream runs what was queued before this copy
        host[...] = device_buf

    def up(self, host, device_buf):
        self.queued.append((host, device_buf))

    def sync(self):
        for host, dev in self.queued:
            dev[...] = host
        self.queued.clear()


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("dtype,op", [(np.float32, "sum"), (np.float32, "avg"),
                                      (np.int32, "max"), (np.float16, "sum")])
def test_down_reduce_up_in_stream_order(n, dtype, op):
    def body(t):
        copies = StandInCopies()
        x = np.full(1001, t.rank + 1, dtype)
        run_host_copy(t, x, ReduceOp(op), 0, copies, x.ctypes.data)
        before_sync = x.copy()  # the copy up is still queued
        run_host_copy(t, x, ReduceOp(op), 0, copies, x.ctypes.data)  # reads call 1's result
        copies.sync()
        return before_sync, x, copies.pinned_made
    once = {"sum": n * (n + 1) / 2, "avg": (n + 1) / 2, "max": n}[op]
    twice = {"sum": n * once, "avg": once, "max": once}[op]
    for r, (before, x, made) in enumerate(run_threads(n, body, timeout_s=60)):
        assert np.all(before == r + 1)  # not yet copied up
        assert np.all(x == np.asarray(twice, dtype)), (op, x[:3])
        assert made == 1  # one pinned buffer, reused


def test_refuses_host_arrays_and_is_registered():
    assert "host_copy" in ALGORITHMS

    def body(t):
        with pytest.raises(ValueError, match=r"host_copy.*needs a device \(CuPy\) array"):
            host_copy_all_reduce(t, np.ones(4, np.float32), ReduceOp.SUM)
        return True
    assert run_threads(2, body, timeout_s=60) == [True, True]


def calibration(rules, measured=1 << 20):
    return Calibration({}, {}, rules, None, 1, measured)


def test_auto_takes_host_copy_only_below_the_measured_cut_over():
    cal = calibration({"2d": [[65536, "host_copy"], [None, "cuda_ipc"]]})
    assert choose_device(2, 4, cal)[0] == "host_copy"
    assert choose_device(2, 4096, cal)[0] == "host_copy"
    name, why = choose_device(2, 1 << 20, cal)
    assert name == "cuda_ipc" and "calibrated rule" in why and "64 KiB" in why
    assert choose_device(2, 64 << 20, cal)[0] == "cuda_ipc"  # beyond what was measured
    assert choose_device(3, 4, cal)[0] == "cuda_ipc"          # no rule for n=3
    name, why = choose_device(2, 4, None)                     # nothing measured: no guess
    assert name == "cuda_ipc" and "minidist.tune" in why


def test_a_calibration_fits_the_device_cut_over_from_its_timings():
    times = {"plain": {8: {"ring": 30.0, "mpi": 10.0}, 1 << 20: {"ring": 300.0, "mpi": 400.0}},
             "device": {8: {"cuda_ipc": 55.0, "host_copy": 25.0},
                        4096: {"cuda_ipc": 56.0, "host_copy": 30.0},
                        1 << 20: {"cuda_ipc": 60.0, "host_copy": 500.0}}}
    model, rules, _ = fit(times, 2)
    assert rules["2d"] == [[65536, "host_copy"], [None, "cuda_ipc"]]
    assert {"cuda_ipc", "host_copy"} <= set(model)
    data = {"format": FORMAT, "key": cache_key("mpi", 2), "model": model, "rules": rules}
    assert validate(data, cache_key("mpi", 2)) is None  # a cache file with it loads
    cal = calibration(rules)
    assert choose_device(2, 4096, cal)[0] == "host_copy"
    assert choose_device(2, 1 << 20, cal)[0] == "cuda_ipc"
