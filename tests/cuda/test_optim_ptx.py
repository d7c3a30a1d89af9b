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


from minidist import optim  # noqa: E402

GROUP = dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01, nesterov=False,
             betas=(0.9, 0.99), eps=1e-6, alpha=0.9)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", sorted(optim.FUSED_STEPS))
def test_optimizer_kernels_compile_to_sm90_ptx(hopper, dtype, name):
    """Every registered fused step's two kernels (flat run, multi-tensor table), built from its
    element function, compile for sm_90."""
    from numba import types

    from minidist.kernels import optim_cuda

    entry = optim.FUSED_STEPS[name]
    t = getattr(types, dtype)
    arr = t[::1]
    suffix = "f32" if dtype == "float32" else "f64"
    scalars = types.Tuple([types.boolean if isinstance(x, bool) else t
                           for x in entry.scalars(GROUP, 1, True)])
    states = types.Tuple([arr] * len(entry.state))
    kernels = optim_cuda.kernels_for(entry)
    for ptx in (compile_or_skip(kernels.flat.py_func, (arr, arr, states, scalars)),
                compile_or_skip(kernels.multi.py_func, (arr, types.int64[::1], scalars))):
        assert ".target sm_90" in ptx
        if name.startswith("adam"):
            assert f"sqrt.rn.{suffix}" in ptx and f"div.rn.{suffix}" in ptx


@pytest.mark.parametrize("dtype", ["float32", "float16", "int32"])
def test_ipc_reduce_kernel_compiles_to_sm90_ptx(hopper, dtype):
    from numba import types

    from minidist.kernels import reduce_cuda

    arr = getattr(types, dtype)[::1]
    ptx = compile_or_skip(reduce_cuda._reduce_kernel.py_func,
                          (arr, types.int64, types.int64) + (arr,) * 8)
    assert ".target sm_90" in ptx
