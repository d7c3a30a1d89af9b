"""The fallback that never crashes: a compiled backend that fails to load, compile or launch
(any exception) gives ONE RuntimeWarning and the reference from then on, before any caller
data changed. End to end with a stand-in Numba that imports but cannot compile anything
(tests/cuda/standin_numba, as numba-cuda 0.30.4 under NumPy 2.5): examples/train.py --amp
trains to the end. The CUDA backend's twin runs under the simulator (tests/cuda)."""

import re
import subprocess
import sys
import types
import warnings

import numpy as np
import pytest

from procs import REPO, job_env

from minidist.kernels import reference as ref
from minidist.kernels.fallback import CompiledBackend, private_copies

STANDIN = REPO / "tests" / "cuda" / "standin_numba"


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    """Each test starts with no cause warned about yet in this process."""
    from minidist.kernels import fallback

    monkeypatch.setattr(fallback, "_WARNED", set())


@pytest.mark.parametrize("flags", [["--amp"], ["--amp", "--master-weights"]])
def test_train_amp_with_a_numba_that_cannot_compile(flags):
    env = job_env()
    env["PYTHONPATH"] = f"{STANDIN}:{env['PYTHONPATH']}"
    res = subprocess.run([sys.executable, str(REPO / "examples" / "train.py"), *flags,
                          "--epochs", "2", "--hidden", "64"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=180)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    assert re.search(r"final test_acc 0\.[5-9]", res.stdout), out[-4000:]
    # exactly one warning, with its cause and its fix, although two compiled backends fail
    # (the AMP kernels and the fused optimizer step: train.py passes fused=True)
    assert out.count("Warning") == 1 and out.count("RuntimeWarning") == 1, out[-4000:]
    (line,) = [x for x in out.splitlines() if "RuntimeWarning" in x]
    assert "numba-cpu" in line and "kernels cannot run here" in line, out[-4000:]
    assert "AttributeError" in line and "row_stack" in line and "pip install -U numba" in line


def test_backends_of_one_toolchain_failing_alike_warn_once(monkeypatch):
    monkeypatch.setitem(sys.modules, "minidist_test_broken_kernels", half_writer("attr"))
    a = CompiledBackend("test-chain", "minidist_test_broken_kernels", "Fix it.")
    b = CompiledBackend("test-chain optimizer", "minidist_test_broken_kernels", "Fix it.")
    grads = np.ones(4, np.float32)
    found = np.zeros(1, np.float32)
    with pytest.warns(RuntimeWarning, match="test-chain kernels cannot run here"):
        a.call("unscale_and_check_", ref.unscale_and_check_, grads, grads, 0.5, found)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same cause from the same toolchain: no warning
        b.call("unscale_and_check_", ref.unscale_and_check_, grads, grads, 0.5, found)
    assert a.module is None and b.module is None and grads.tolist() == [0.25] * 4


def half_writer(name):
    """A backend module whose ops write half of every output, then raise ``name``."""
    mod = types.ModuleType("minidist_test_broken_kernels")
    mod.check_usable = lambda: None
    mod.calls = 0

    def op(*args):
        mod.calls += 1
        for a in args:
            if isinstance(a, np.ndarray) and a.dtype == np.float32 and a.size > 1:
                a[: a.size // 2] = -123.0
        raise {"attr": AttributeError, "type": TypeError, "rt": RuntimeError}[name]("boom")

    mod.unscale_and_check_ = mod.master_to_model = op
    return mod


@pytest.mark.parametrize("error", ["attr", "type", "rt"])
def test_any_exception_falls_back_before_any_data_changed(monkeypatch, error):
    monkeypatch.setitem(sys.modules, "minidist_test_broken_kernels", half_writer(error))
    fused = CompiledBackend("test-kernels", "minidist_test_broken_kernels", "Fix it like this.")
    grads = np.array([2.0, 4.0, np.inf, 8.0, 16.0], np.float32)  # in place: twice = wrong
    found = np.zeros(1, np.float32)
    with pytest.warns(RuntimeWarning, match=r"test-kernels kernels cannot run here \(compiling "
                      r"or first launching unscale_and_check_ failed: \w+Error: boom\).*Fix it"):
        fused.call("unscale_and_check_", ref.unscale_and_check_, grads, grads, 0.5, found)
    assert grads.tolist() == [1.0, 2.0, np.inf, 4.0, 8.0] and found[0] == 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning, no second try
        fused.call("master_to_model", ref.master_to_model, grads[:2], np.empty(2, np.float16))
    assert sys.modules["minidist_test_broken_kernels"].calls == 1 and fused.module is None


def test_a_module_that_cannot_load_warns_once(monkeypatch):
    fused = CompiledBackend("test-kernels", "minidist.kernels.no_such_module", "Install it.")
    x = np.ones(3, np.float32)
    with pytest.warns(RuntimeWarning, match="loading minidist.kernels.no_such_module failed: "
                      "ModuleNotFoundError.*Install it"):
        fused.call("unscale_and_check_", ref.unscale_and_check_, x, x, 0.5, np.zeros(1, np.float32))
    assert x.tolist() == [0.5] * 3


def test_rehearsal_is_once_per_signature_and_on_private_copies(monkeypatch):
    mod = types.ModuleType("minidist_test_counting_kernels")
    mod.check_usable = lambda: None
    seen = []

    def op(src, dst, inv, found):
        seen.append((src.size, src is dst, src.dtype.name))
        ref.unscale_and_check_(src, dst, inv, found)

    mod.unscale_and_check_ = op
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    fused = CompiledBackend("counting", mod.__name__, "")
    big = np.arange(1000, dtype=np.float32)
    found = np.zeros(1, np.float32)
    for _ in range(3):
        fused.call("unscale_and_check_", ref.unscale_and_check_, big, big, 1.0, found)
    fused.call("unscale_and_check_", ref.unscale_and_check_, big.astype(np.float16),
               np.empty(1000, np.float32), 1.0, found)
    assert seen == [(67, True, "float32"), (1000, True, "float32"), (1000, True, "float32"),
                    (1000, True, "float32"), (67, False, "float16"), (1000, False, "float16")]


def test_private_copies_keep_aliasing_and_leave_numbers():
    a, b = np.arange(100, dtype=np.float32), np.ones(1, np.float32)
    ca, ca2, cb, inv, lst = private_copies((a, a, b, 0.5, [a, b]))
    assert ca is ca2 and ca.size == 67 and cb.size == 1 and inv == 0.5 and lst[0] is ca
    assert not np.shares_memory(ca, a)


def test_numba_cuda_under_numpy_2_5_is_one_line_with_both_versions_and_the_fix(monkeypatch):
    numba_cuda = pytest.importorskip("numba.cuda")
    del numba_cuda
    from minidist.kernels import cuda as kcuda

    if kcuda.JIT != "numba-cuda" or kcuda.SIMULATOR:
        pytest.skip("needs numba's CUDA target (not the simulator, not numba-cuda-mlir)")
    monkeypatch.delattr(np, "row_stack")  # as NumPy 2.5
    with pytest.raises(RuntimeError) as info:
        kcuda.check_usable()
    msg = str(info.value)
    assert "\n" not in msg and f"under NumPy {np.__version__}" in msg
    assert re.search(r"^numba(-cuda)? \d+\.\d+\S* .*cannot compile kernels", msg)
    assert "numpy<2.5" in msg and "numba-cuda-mlir" in msg


def test_with_warnings_as_errors_the_fallback_logs_instead_of_raising(monkeypatch, caplog):
    """-W error must not turn the fallback into a crash (e.g. inside DDP's comm thread)."""
    monkeypatch.setitem(sys.modules, "minidist_test_broken_kernels", half_writer("attr"))
    fused = CompiledBackend("test-kernels", "minidist_test_broken_kernels", "Fix it.")
    x = np.array([2.0, 4.0], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fused.call("unscale_and_check_", ref.unscale_and_check_, x, x, 0.5, np.zeros(1, np.float32))
    assert x.tolist() == [1.0, 2.0]
    assert any("test-kernels kernels cannot run here" in r.getMessage() for r in caplog.records)
