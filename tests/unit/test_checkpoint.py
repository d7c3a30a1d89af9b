"""Checkpoint I/O: lossless codec, atomic write, latest discovery, clear errors on bad files."""

import json

import numpy as np
import pytest

from minidist.checkpoint import (CheckpointError, check_state_dict, checkpoint_path,
                                 latest_checkpoint, load_checkpoint, save_checkpoint)


def _state():
    rng = np.random.default_rng(0)
    return {
        "model": {"fc1.weight": rng.normal(size=(3, 4)).astype(np.float32),
                  "fc1.bias": np.zeros(3, np.float32)},
        "optimizer": {"state": {0: {"step": np.float32(7.0), "exp_avg": np.ones((3, 4))}},
                      "param_groups": [{"lr": 0.1, "betas": (0.9, 0.999), "params": [0, 1]}]},
        "rng": np.random.default_rng(5).bit_generator.state,   # holds 128-bit ints
        "legacy_rng": np.random.RandomState(3).get_state(),    # a tuple with an array
        "epoch": 4, "name": "run", "none": None, "nan": float("nan"),
        "weird": {"__array__": 1},
    }


def test_roundtrip_is_lossless(tmp_path):
    s = _state()
    p = save_checkpoint(tmp_path / "c.npz", s)
    back = load_checkpoint(p)
    np.testing.assert_array_equal(back["model"]["fc1.weight"], s["model"]["fc1.weight"])
    assert back["model"]["fc1.weight"].dtype == np.float32
    st = back["optimizer"]["state"][0]                     # int key survives
    assert isinstance(st["step"], np.float32) and st["step"] == 7.0
    assert back["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.999)
    assert back["rng"] == s["rng"]
    g = np.random.default_rng()
    g.bit_generator.state = back["rng"]
    assert g.random() == np.random.default_rng(5).random()
    r = np.random.RandomState()
    r.set_state(back["legacy_rng"])
    assert r.randint(1 << 30) == np.random.RandomState(3).randint(1 << 30)
    assert back["epoch"] == 4 and back["name"] == "run" and back["none"] is None
    assert np.isnan(back["nan"]) and back["weird"] == {"__array__": 1}
    with np.load(p, allow_pickle=False) as z:              # it is plain data
        assert "model/fc1.weight" in z.files


def test_atomic_write_leaves_no_temp_and_latest_finds_newest(tmp_path):
    for e in (1, 2, 10):
        save_checkpoint(checkpoint_path(tmp_path, e), {"epoch": e})
    (tmp_path / "checkpoint-junk.npz").write_bytes(b"x")
    assert latest_checkpoint(tmp_path).name == "checkpoint-000010.npz"
    assert latest_checkpoint(tmp_path / "nope") is None
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


def test_unstorable_value_names_the_path(tmp_path):
    with pytest.raises(TypeError, match="model/x"):
        save_checkpoint(tmp_path / "c.npz", {"model": {"x": object()}})
    assert not (tmp_path / "c.npz").exists()


def test_truncated_file_raises_naming_the_file(tmp_path):
    p = save_checkpoint(tmp_path / "c.npz", _state())
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="c.npz.*truncated"):
        load_checkpoint(p)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "missing.npz")
    np.savez(tmp_path / "plain.npz", a=np.zeros(2))
    with pytest.raises(CheckpointError, match="not a minidist checkpoint"):
        load_checkpoint(tmp_path / "plain.npz")


def test_check_state_dict_names_key_and_shapes():
    live = {"w": np.zeros((2, 3)), "b": np.zeros(2)}
    check_state_dict(live, {"w": np.ones((2, 3)), "b": np.ones(2)}, "model", "f.npz")
    with pytest.raises(CheckpointError, match=r"'w' has shape \(3, 2\).*\(2, 3\)"):
        check_state_dict(live, {"w": np.ones((3, 2)), "b": np.ones(2)}, "model", "f.npz")
    with pytest.raises(CheckpointError, match=r"missing from the checkpoint: \['b'\]"):
        check_state_dict(live, {"w": np.ones((2, 3))}, "model", "f.npz")
