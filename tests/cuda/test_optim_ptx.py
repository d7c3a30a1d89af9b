"""The fused-optimizer (and CUDA-IPC reduce) kernels compile to PTX for Hopper (sm_90) without a
GPU: typing and lowering as the GPU runs them, which the simulator (plain Python) cannot check.

Needs numba-cuda with NVRTC/NVVM (``pip install 'numba-cuda[cu13]'``); skipped otherwise (as
tests/cuda/test_kernels_ptx.py, whose device-capability stand-in this reuses).
"""

import pytest

numba_cuda = pytest.importorskip("numba.cuda")
if getattr(numba_cuda, "implementation", "") != "NVIDIA":
    pytest.skip("needs the numba-cuda package (not numba's built-in CUDA target)",
                allow_module_level=True)


@pytest.fixture
def hopper(monkeypatch):
    from numba.cuda import dispatcher

    class Hopper:
        compute_capability = (9, 0)

    monkeypatch.setattr(dispatcher, "get_current_device", lambda: Hopper())


def compile_or_skip(pyfunc, sig):
    from numba import cuda

    try:
        return cuda.compile_ptx(pyfunc, sig, cc=(9, 0))[0]
    except Exception as exc:  # no NVRTC/NVVM in this install
        if "nvrtc" in str(exc).lower() or "nvvm" in str(exc).lower():
            pytest.skip(f"numba-cuda without its CUDA toolkit extra: {exc}")
        raise


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_optimizer_kernels_compile_to_sm90_ptx(hopper, dtype):
    from numba import types

    from minidist.kernels import optim_cuda

    t = getattr(types, dtype)
    arr = t[::1]
    suffix = "f32" if dtype == "float32" else "f64"
    ptx = compile_or_skip(optim_cuda._adam_kernel.py_func, (arr,) * 4 + (t,) * 9)
    assert ".target sm_90" in ptx and f"sqrt.rn.{suffix}" in ptx and f"div.rn.{suffix}" in ptx
    ptx = compile_or_skip(optim_cuda._sgd_kernel.py_func,
                          (arr,) * 3 + (t,) * 4 + (types.boolean,) * 2)
    assert ".target sm_90" in ptx


@pytest.mark.parametrize("dtype", ["float32", "float16", "int32"])
def test_ipc_reduce_kernel_compiles_to_sm90_ptx(hopper, dtype):
    from numba import types

    from minidist.kernels import reduce_cuda

    arr = getattr(types, dtype)[::1]
    ptx = compile_or_skip(reduce_cuda._reduce_kernel.py_func,
                          (arr, types.int64, types.int64) + (arr,) * 8)
    assert ".target sm_90" in ptx
