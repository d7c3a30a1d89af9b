"""minidist.save / minidist.load: torch.save/torch.load for state dicts, as data, not collective."""

import io
from collections import OrderedDict

import numpy as np
import pytest
from procs import REPO, run_mpi

import minidist
from minidist import nn, optim
from minidist.tensor import Tensor


def test_state_dicts_round_trip_through_a_path_and_a_file_object(tmp_path):
    nn.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(Tensor(np.ones((2, 3), np.float32))).sum().backward()
    opt.step()
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 3,
             "loss": 0.25, "note": "x", "tensor": Tensor(np.arange(3.0)), "pair": (1, None)}
    minidist.save(state, tmp_path / "a.npz")
    buf = io.BytesIO()
    minidist.save(state, buf)
    buf.seek(0)
    for got in (minidist.load(tmp_path / "a.npz"), minidist.load(buf, map_location="cpu")):
        assert (got["epoch"], got["loss"], got["note"], got["pair"]) == (3, 0.25, "x", (1, None))
        np.testing.assert_array_equal(got["tensor"], np.arange(3.0))
        assert list(got["model"]) == list(model.state_dict())
        for k, v in model.state_dict().items():
            np.testing.assert_array_equal(got["model"][k], v)
            assert got["model"][k].dtype == v.dtype
        fresh = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
        fresh.load_state_dict(got["model"])
        opt2 = optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9)
        opt2.load_state_dict(got["optimizer"])
    assert not list(tmp_path.glob(".*tmp*"))  # the temporary file is gone


def test_save_writes_the_checkpoint_format(tmp_path):
    minidist.save(OrderedDict(w=np.ones(2, np.float32)), tmp_path / "w.npz")
    np.testing.assert_array_equal(minidist.load_checkpoint(tmp_path / "w.npz")["w"], np.ones(2))


def test_missing_file_and_foreign_file_raise_clearly(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        minidist.load(tmp_path / "nope.pt")
    (tmp_path / "torch.pt").write_bytes(b"\x80\x02not a zip")
    with pytest.raises(ValueError, match="not a file minidist.save wrote"):
        minidist.load(tmp_path / "torch.pt")
    with pytest.raises(TypeError, match="cannot pickle"):
        minidist.save({"f": lambda: 0}, tmp_path / "bad.npz")    # torch.save refuses it too
    with pytest.raises(TypeError, match="map_location"):
        minidist.save({}, tmp_path / "ok.npz") or minidist.load(tmp_path / "ok.npz",
                                                                map_location=lambda s, loc: s)


def test_map_location_dict_as_the_ddp_tutorial_passes_it(tmp_path):
    """torch's dict moves only the arrays saved on a device it names: these were saved from
    the CPU, so they stay there whatever the dict says, and no GPU is needed."""
    minidist.save({"w": np.ones(2, np.float32)}, tmp_path / "w.pt")
    for where in ({"cuda:0": "cpu"}, {"cuda:0": "cuda:1"}, {"cuda:0": "cpu", "cuda:1": "cuda:0"}):
        state = minidist.load(tmp_path / "w.pt", map_location=where)
        assert isinstance(state["w"], np.ndarray)
        np.testing.assert_array_equal(state["w"], np.ones(2))


def test_whole_module_pickles_and_loads_only_with_weights_only_false(tmp_path):
    import pickle

    from minidist import nn
    minidist.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.LSTM(4, 2))
    x = minidist.randn(5, 3)
    model[0](x).sum().backward()                     # a gradient is saved with its parameter
    minidist.save(model, tmp_path / "model.pt")
    with pytest.raises(pickle.UnpicklingError, match="weights_only=False"):
        minidist.load(tmp_path / "model.pt")
    with pytest.raises(pickle.UnpicklingError, match="weights_only=False"):
        minidist.load(tmp_path / "model.pt", weights_only=True)
    loaded = minidist.load(tmp_path / "model.pt", weights_only=False)
    assert type(loaded) is nn.Sequential and isinstance(loaded[1], nn.LSTM)
    for (n, a), (m, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert n == m
        np.testing.assert_array_equal(a.array if hasattr(a, "array") else a,
                                      b.array if hasattr(b, "array") else b)
    np.testing.assert_array_equal(loaded[0].weight.grad, model[0].weight.grad)
    assert isinstance(loaded[0].weight, nn.Parameter) and loaded[0].weight.requires_grad
    bundle = minidist.load(_save(tmp_path / "b.pt", {"model": model, "epoch": 3}),
                           weights_only=False)
    assert bundle["epoch"] == 3 and isinstance(bundle["model"], nn.Sequential)


def _save(path, obj):
    minidist.save(obj, path)
    return path


@pytest.mark.mpi
def test_rank0_only_save_does_not_hang(tmp_path):
    result = run_mpi(2, [REPO / "tests/checkpoint/save_rank0.py", tmp_path / "m.npz"], timeout_s=60)
    assert result.returncode == 0, result.report()
    assert result.stdout.count("loaded ok") == 2, result.report()


BFLOAT16_SAVE = r"""
import sys, minidist, numpy as np
x = minidist.tensor([1.5, -2.0, 3.25]).to(minidist.bfloat16)
minidist.save({"x": x, "one": x.array[0], "f": np.ones(2, np.float32)}, sys.argv[1])
"""
BFLOAT16_LOAD = r"""
import sys, json, minidist
got = minidist.load(sys.argv[1])
print("RESULT " + json.dumps([str(got["x"].dtype), got["x"].astype("float32").tolist(),
                              str(got["one"].dtype), float(got["one"]), str(got["f"].dtype)]))
"""


def test_bfloat16_arrays_come_back_as_bfloat16_in_a_process_that_never_asked_for_it(tmp_path):
    """npz keeps a bfloat16 array's bytes only ("V2"): the entry names the dtype, and load
    imports ml_dtypes for it (``import minidist`` does not: tensor/dtypes.py)."""
    from procs import run_python

    path = tmp_path / "bf16.npz"
    assert run_python(["-c", BFLOAT16_SAVE, path], timeout_s=60).returncode == 0
    res = run_python(["-c", BFLOAT16_LOAD, path], timeout_s=60)
    assert res.returncode == 0, res.report()
    line = next(x for x in res.stdout.splitlines() if x.startswith("RESULT "))
    assert line[7:] == '["bfloat16", [1.5, -2.0, 3.25], "bfloat16", 1.5, "float32"]'
