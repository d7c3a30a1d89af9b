"""torch's ``device=``/``dtype=`` on every layer, in torch's argument order (checked against
torch's signatures and state_dict dtypes when torch is installed)."""

import inspect

import numpy as np
import pytest

import minidist
from minidist import nn

LAYERS = {
    "Linear": ((3, 2), {}),
    "Embedding": ((5, 3), {}),
    "Conv2d": ((1, 2, 3), {}),
    "LayerNorm": ((4,), {}),
    "BatchNorm1d": ((3,), {}),
    "BatchNorm2d": ((3,), {}),
    "MultiheadAttention": ((4, 2), {}),
}


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_device_and_dtype_place_every_parameter_and_buffer(name):
    args, kwargs = LAYERS[name]
    layer = getattr(nn, name)(*args, device="cpu", dtype=minidist.float64, **kwargs)
    for key, value in layer.state_dict().items():
        expected = np.int64 if key.endswith("num_batches_tracked") else np.float64
        assert value.dtype == expected, key
    assert all(p.device == minidist.device("cpu") for p in layer.parameters())
    plain = getattr(nn, name)(*args, **kwargs)
    assert all(p.dtype == np.float32 for p in plain.parameters())
    if not minidist.cuda.is_available():
        with pytest.raises(minidist.DeviceUnavailableError):
            getattr(nn, name)(*args, device="cuda", **kwargs)


def test_seeded_weights_do_not_depend_on_device_or_dtype():
    minidist.manual_seed(5)
    a = nn.Linear(4, 3)
    minidist.manual_seed(5)
    b = nn.Linear(4, 3, device="cpu", dtype=minidist.float64)
    np.testing.assert_allclose(a.weight.array, b.weight.array, rtol=1e-6)


def test_unsupported_layer_options_are_refused():
    with pytest.raises(ValueError, match="groups=2"):
        nn.Conv2d(2, 2, 3, groups=2)
    with pytest.raises(ValueError, match="max_norm"):
        nn.Embedding(5, 3, max_norm=1.0)
    weights = np.arange(6.0).reshape(3, 2)
    frozen = nn.Embedding(3, 2, _weight=weights, _freeze=True)
    np.testing.assert_array_equal(frozen.weight.array, weights)
    assert not frozen.weight.requires_grad
    assert nn.LayerNorm(4, bias=False).bias is None


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_signature_and_dtypes_match_torch(name):
    torch = pytest.importorskip("torch")
    ours = list(inspect.signature(getattr(nn, name).__init__).parameters)
    theirs = list(inspect.signature(getattr(torch.nn, name).__init__).parameters)
    assert ours == theirs
    args, kwargs = LAYERS[name]
    t = getattr(torch.nn, name)(*args, device="cpu", dtype=torch.float64, **kwargs)
    m = getattr(nn, name)(*args, device="cpu", dtype=minidist.float64, **kwargs)
    assert {k: str(v.dtype).replace("torch.", "") for k, v in t.state_dict().items()} == \
        {k: str(v.dtype) for k, v in m.state_dict().items()}
