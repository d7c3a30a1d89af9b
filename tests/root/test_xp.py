import numpy as np
import pytest

from minidist import xp


def test_numpy_is_the_default_module():
    a = np.zeros(3)
    assert xp.get_array_module(a) is np
    assert xp.default_array_module() is np
    assert xp.to_host(a) is a or np.array_equal(xp.to_host(a), a)


def test_missing_gpu_gives_a_clear_message():
    if xp.gpu_available():
        pytest.skip("a real GPU is present")
    with pytest.raises(xp.DeviceUnavailableError, match="MINIDIST_DEVICE=cpu"):
        xp.set_default_device("cuda")
    assert xp.default_device() == "cpu"


def test_unknown_device_is_rejected():
    with pytest.raises(ValueError, match="unknown device"):
        xp.set_default_device("tpu")


def test_unknown_device_from_the_environment_is_rejected(monkeypatch):
    monkeypatch.setattr(xp, "_default_device", "gpu")  # as if MINIDIST_DEVICE=gpu at import
    with pytest.raises(ValueError, match="MINIDIST_DEVICE='gpu'"):
        xp.default_array_module()
