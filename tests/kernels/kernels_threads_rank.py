"""Run by test_kernels.py with NUMBA_NUM_THREADS=3 and the workqueue threading layer.

1. A single NaN/inf at every position of short arrays is found, whichever of the 3 prange
   chunks it falls in (chunk heads and tails included), and dst matches the reference.
2. Four Python threads call the parallel kernels at once. The workqueue layer aborts the
   process on concurrent parallel launches; the kernels' lock makes them take turns.
"""

import threading

import numba
import numpy as np

from minidist import kernels
from minidist.kernels import cpu, reference as ref

assert numba.config.NUMBA_NUM_THREADS == 3, numba.config.NUMBA_NUM_THREADS
cpu.PARALLEL_MIN_NUMEL = 1  # the prange loops even for these short arrays

for dtype in (np.float32, np.float16):
    for n in (3, 4, 5, 100, 301):
        for i in range(n):
            for bad in (np.inf, np.nan):
                src = np.linspace(-2, 2, n).astype(dtype)
                src[i] = bad
                got, want = np.empty(n, np.float32), np.empty(n, np.float32)
                assert kernels.unscale_and_check(src, got, 0.25), (dtype, n, i)
                assert ref.unscale_and_check(src, want, 0.25)
                assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (dtype, n, i)
assert numba.threading_layer() == "workqueue", numba.threading_layer()

h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
got, want = np.empty(h.size, np.float32), np.empty(h.size, np.float32)
assert kernels.unscale_and_check(h, got, 1 / 3) and ref.unscale_and_check(h, want, 1 / 3)
assert np.array_equal(got.view(np.uint32), want.view(np.uint32))

errors = []


def worker(seed):
    try:
        rng = np.random.default_rng(seed)
        for _ in range(30):
            g16 = rng.standard_normal(20_001).astype(np.float16)
            master, want = np.empty(g16.size, np.float32), np.empty(g16.size, np.float32)
            found = kernels.unscale_and_check(g16, master, 1 / 8)
            ref.unscale_and_check(g16, want, 1 / 8)
            assert found is False and np.array_equal(master, want)
            model = np.empty(g16.size, np.float16)
            kernels.master_to_model(master, model)
            assert np.array_equal(model, master.astype(np.float16))
    except BaseException as exc:  # reported by the main thread
        errors.append(exc)


threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert not errors, errors
print("threads ok")
