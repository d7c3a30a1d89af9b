"""cross_entropy's fused CuPy kernels on a real GPU, against the NumPy reference.

Skipped without CuPy and a GPU. CPU twin: tests/root/test_sync_free_step.py (the same
expectations, through ``functional.cross_entropy_on_device`` on NumPy arrays: values,
gradients, ignore_index masking, a bad label's NaN) and the counted sync-free step.
"""

import numpy as np
import pytest

from minidist import xp as backend
from minidist.tensor import Tensor
from minidist.tensor import losses as F
from minidist.tensor import xent_cupy

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cp():
    if not backend.gpu_available():
        pytest.skip("no CuPy or no CUDA GPU")
    import cupy

    return cupy


def run(x, t, reduction, device, cp=None):
    data = cp.asarray(x) if device else x
    logits = Tensor(data, requires_grad=True)
    target = cp.asarray(t) if device else t
    loss = F.cross_entropy(logits, target, reduction=reduction)
    (loss.sum() if reduction == "none" else loss).backward()
    host = (lambda a: cp.asnumpy(a)) if device else np.asarray
    grad = logits.grad.array if isinstance(logits.grad, Tensor) else logits.grad
    return host(loss.array), host(grad)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("shape", [(64, 10), (7, 1000), (1, 3)])
def test_fused_kernels_equal_the_reference(cp, dtype, reduction, shape):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(shape) * 4).astype(dtype)
    t = rng.integers(0, shape[1], shape[0])
    got, got_grad = run(x, t, reduction, True, cp)
    want, want_grad = run(x, t, reduction, False)
    assert xent_cupy.available()
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    np.testing.assert_allclose(got_grad, want_grad, rtol=tol, atol=tol)


def test_ignore_index_and_bad_labels_on_the_device(cp):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 5)).astype(np.float32)
    t = np.array([0, -100, 4, 2, -100, 1])
    got, grad = run(x, t, "mean", True, cp)
    want, want_grad = run(x, t, "mean", False)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-7)
    bad = np.array([0, 7, 4, 2, -100, 1])  # 7: outside [0, 5): NaN, no host read, no raise
    per_row, _ = run(x, bad, "none", True, cp)
    assert np.isnan(per_row[1]) and np.isfinite(np.delete(per_row, 1)).all()
    with backend.count_host_transfers() as counts:
        F.cross_entropy(Tensor(cp.asarray(x)), cp.asarray(t))
    assert counts == {}
