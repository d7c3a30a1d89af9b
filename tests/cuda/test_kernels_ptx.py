"""The CUDA kernels compile to PTX for Hopper (sm_90) without a GPU: typing and lowering as the
H100 runs them, which the simulator (plain Python) cannot check.

Needs numba-cuda with NVRTC/NVVM (``pip install 'numba-cuda[cu13]'``, ~0.8 GB); skipped
otherwise, so CI without it skips. Numba-cuda asks the current device for its compute
capability when it compiles a *device* function called by a kernel, so this test answers that
question with (9, 0) instead of a driver.
"""

import re

import pytest

numba_cuda = pytest.importorskip("numba.cuda")
if getattr(numba_cuda, "implementation", "") != "NVIDIA":
    pytest.skip("needs the numba-cuda package (not numba's built-in CUDA target)",
                allow_module_level=True)


@pytest.fixture
def kcuda(monkeypatch):
    from numba.cuda import dispatcher

    from minidist.kernels import cuda as kcuda

    class Hopper:
        compute_capability = (9, 0)

    monkeypatch.setattr(dispatcher, "get_current_device", lambda: Hopper())
    return kcuda


def test_every_kernel_compiles_to_sm90_ptx(kcuda):
    from numba import cuda, types

    f32, f16, i32 = types.float32[::1], types.float16[::1], types.int32[::1]
    tup = lambda t, k: types.UniTuple(t, k)  # noqa: E731
    cases = [
        ("unscale_kernel", (f32, f32, types.float32, f32), "mul.f32"),
        ("unscale_kernel", (f16, f32, types.float32, f32), "cvt.f32.f16"),
        ("unscale_kernel_device_inv", (f16, f32, f32, f32), "cvt.f32.f16"),
        ("foreach_unscale_kernel", (tup(f16, 4), tup(f32, 4), types.int64, types.float32, f32),
         "cvt.f32.f16"),
        ("foreach_unscale_kernel", (tup(f32, 16), tup(f32, 16), types.int64, types.float32,
                                     f32), "mul.f32"),
        ("foreach_unscale_kernel_device_inv", (tup(f32, 4), tup(f32, 4), types.int64, f32, f32),
         "mul.f32"),
        ("to_half_kernel", (f32, f16), "cvt.rn.f16.f32"),  # round to nearest even
        ("update_scale_kernel", (f32, i32, f32, types.float64, types.float64, types.int64),
         "cvt.rn.f32.f64"),  # products in float64, narrowed once, as ATen
    ]
    for name, sig, needle in cases:
        try:
            ptx, _ = cuda.compile_ptx(getattr(kcuda, name).py_func, sig, cc=(9, 0))
        except Exception as exc:  # no NVRTC/NVVM in this install
            if "nvrtc" in str(exc).lower() or "nvvm" in str(exc).lower():
                pytest.skip(f"numba-cuda without its CUDA toolkit extra: {exc}")
            raise
        assert ".target sm_90" in ptx and needle in ptx, (name, sig)
        if name != "update_scale_kernel":  # unrolled: four loads before the first store
            # (global or generic: the multi-buffer kernel's tuple entries are generic pointers)
            loads = [m.start() for m in re.finditer(r"\bld\.(global\.)?[ufb](16|32)", ptx)]
            stores = [m.start() for m in re.finditer(r"\bst\.(global\.)?[ufb](16|32)", ptx)]
            assert len(loads) >= 4 and loads[3] < stores[0], (name, sig)
