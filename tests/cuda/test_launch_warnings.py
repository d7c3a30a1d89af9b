"""Our launches configure small grids on purpose, without Numba's low-occupancy warning.

numba.cuda warns "Grid size N will likely result in GPU under-utilization" when a launch
configuration ``kernel[blocks, threads, stream]`` with fewer than 128 blocks is BUILT (no GPU
is needed for that), reading ``config.CUDA_LOW_OCCUPANCY_WARNINGS`` each time. minidist builds
its configurations through ``kernels.cuda.configure_quietly``, which turns that flag off for
its own configuration only. The simulator never warns, so this runs in the normal process.
"""

import sys
import warnings

import pytest

kcuda = pytest.importorskip("minidist.kernels.cuda")
if kcuda.SIMULATOR:  # pragma: no cover - only when the whole run is under the simulator
    pytest.skip("the simulator does not warn about occupancy", allow_module_level=True)

from minidist.kernels import optim_cuda  # noqa: E402

cuda = kcuda.cuda


@cuda.jit
def tiny(a):  # pragma: no cover - never launched here
    a[0] = 1


def test_a_small_grid_warns_unless_configured_quietly():
    if not getattr(sys.modules[type(tiny).__module__], "config", None):
        pytest.skip("this numba.cuda decides the warning elsewhere")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        tiny[1, 32, 0]                                   # a user's own launch: warned
    assert any("under-utilization" in str(w.message) for w in seen)
    with warnings.catch_warnings():
        warnings.simplefilter("error")                   # any warning fails the test
        kcuda.configure_quietly(tiny, 1, 32, 0)
        optim_cuda.configured(tiny, 1, 1)                # the optimizer's and reduce's path
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        tiny[2, 32, 0]                                   # the flag is back for the user
    assert any("under-utilization" in str(w.message) for w in seen)


def test_the_check_is_off_while_our_configuration_is_built_and_back_after():
    dispatcher_module = sys.modules[type(tiny).__module__]
    config = getattr(dispatcher_module, "config", None)
    if config is None or not config.CUDA_LOW_OCCUPANCY_WARNINGS:
        pytest.skip("this numba.cuda decides the warning elsewhere (or has it off)")
    seen = []

    class Probe:  # looks up its config where Numba's dispatcher does
        def __getitem__(self, launch):
            seen.append(config.CUDA_LOW_OCCUPANCY_WARNINGS)
            return launch

    Probe.__module__ = dispatcher_module.__name__
    assert kcuda.configure_quietly(Probe(), 1, 32, 0) == (1, 32, 0)
    assert seen == [0] and config.CUDA_LOW_OCCUPANCY_WARNINGS
