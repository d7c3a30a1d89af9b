"""Compile every CUDA kernel to sm_90 PTX with numba-cuda-mlir, without a GPU (run by
test_kernels_ptx_mlir.py in its own process: MINIDIST_CUDA_JIT must be set before
minidist.kernels.cuda is imported). Prints one line per kernel; exit status 0 when all pass.

numba-cuda-mlir asks the current device for its compute capability even when ``cc`` is given;
the answer is cached in ``numba_cuda_mlir.tools._cached_cc``, which this script fills with
(9, 0) instead of a driver. NVRTC must be installed (the [cu12]/[cu13] extra)."""

import os
import re
import sys

os.environ["MINIDIST_CUDA_JIT"] = "numba-cuda-mlir"

import numba_cuda_mlir.tools as tools  # noqa: E402

tools._cached_cc = (9, 0)

from numba_cuda_mlir import cuda  # noqa: E402

from minidist.kernels import cuda as kcuda  # noqa: E402

assert kcuda.JIT == "numba-cuda-mlir", kcuda.JIT
f32, f16, i32 = "float32[::1]", "float16[::1]", "int32[::1]"
CASES = [
    ("unscale_kernel", f"void({f32}, {f32}, float32, {f32})", "mul.f32"),
    ("unscale_kernel", f"void({f16}, {f32}, float32, {f32})", "cvt.f32.f16"),
    ("unscale_kernel_device_inv", f"void({f16}, {f32}, {f32}, {f32})", "cvt.f32.f16"),
    ("foreach_unscale_kernel", f"void(UniTuple({f16}, 4), UniTuple({f32}, 4), int64, float32, "
     f"{f32})", "cvt.f32.f16"),
    ("foreach_unscale_kernel_device_inv", f"void(UniTuple({f32}, 16), UniTuple({f32}, 16), "
     f"int64, {f32}, {f32})", "mul.f32"),
    ("to_half_kernel", f"void({f32}, {f16})", "cvt.rn.f16.f32"),
    ("update_scale_kernel", f"void({f32}, {i32}, {f32}, float64, float64, int64)",
     "cvt.rn.f32.f64"),
]
failed = 0
for name, sig, needle in CASES:
    try:
        ptx, _ = cuda.compile_ptx(getattr(kcuda, name).py_func, sig, cc=(9, 0))
    except Exception as exc:  # report, go on
        if "nvrtc" in str(exc).lower():
            print(f"SKIP numba-cuda-mlir without NVRTC: {exc}")
            sys.exit(0)
        print(f"FAIL {name} {sig}: {type(exc).__name__}: {exc}")
        failed += 1
        continue
    loads = [m.start() for m in re.finditer(r"\bld\.(global\.)?[ufb](16|32)", ptx)]
    stores = [m.start() for m in re.finditer(r"\bst\.(global\.)?[ufb](16|32)", ptx)] or [0]
    unrolled = name == "update_scale_kernel" or (len(loads) >= 4 and loads[3] < stores[0])
    ok = ".target sm_90" in ptx and needle in ptx and unrolled
    failed += not ok
    print(f"{'ok' if ok else 'FAIL'} {name} {sig} (loads before the first store: "
          f"{sum(p < stores[0] for p in loads)})")
sys.exit(1 if failed else 0)
