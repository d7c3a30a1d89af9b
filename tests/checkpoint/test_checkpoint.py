"""Checkpoint I/O: lossless codec, atomic write, latest discovery, clear errors on bad files,
non-finite refusal, stale temporary files, pruning, and a byte-flip fuzz of the reader."""

import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from minidist.checkpoint import (TRAILER_NBYTES, CheckpointError, check_state_dict,
                                 checkpoint_path, latest_checkpoint, load_checkpoint,
                                 prune_checkpoints, remove_stale_temp_files, save_checkpoint)


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
    with pytest.raises(CheckpointError, match="c.npz is not a readable checkpoint.*truncated"):
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


# ----------------------------------------------------------------------------- damaged files


def _small_checkpoint(tmp_path):
    """A real, small checkpoint: arrays of several dtypes, an int-keyed dict, an RNG state."""
    rng = np.random.default_rng(0)
    state = {"model": {"0.weight": rng.normal(size=(6, 5)).astype(np.float32),
                       "0.bias": np.arange(6, dtype=np.float64)},
             "optimizer": {"state": {0: {"step": np.int64(3)}}, "param_groups": [{"lr": 0.1}]},
             "rng": np.random.default_rng(1).bit_generator.state, "epoch": 2}
    return save_checkpoint(tmp_path / "checkpoint-000002.npz", state), state


def _same(a, b):
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray) or isinstance(a, np.generic):
        return np.asarray(b).dtype == np.asarray(a).dtype and np.array_equal(a, b)
    return a == b


def test_every_flipped_byte_and_every_cut_raises_checkpoint_error_naming_the_file(tmp_path):
    good, state = _small_checkpoint(tmp_path)
    data = good.read_bytes()
    assert _same(state, load_checkpoint(good))
    bad = tmp_path / "damaged.npz"
    positions = np.unique(np.linspace(0, len(data) - 1, 300).astype(int))
    variants = [data[:p] + bytes([data[p] ^ 0xFF]) + data[p + 1:] for p in positions]
    variants += [data[:n] for n in np.linspace(0, len(data) - 1, 40).astype(int)]  # cut short
    variants += [data + b"\0", data[:-TRAILER_NBYTES]]  # grown; the trailer stripped
    for i, v in enumerate(variants):
        bad.write_bytes(v)
        with pytest.raises(CheckpointError, match="damaged.npz") as e:
            load_checkpoint(bad)
        assert e.value.path == bad and e.value.reason, i


def _legacy_checkpoint(path, w):
    """A file as minidist wrote them before the CRC-32 trailer: zip CRC-32s only."""
    meta = {"format_version": 1, "state": {"model": {"w": {"__array__": "model/w"}}, "epoch": 3}}
    np.savez(path, **{"model/w": w, "__meta__.json": np.frombuffer(json.dumps(meta).encode(),
                                                                   np.uint8)})


def test_files_without_trailer_still_load_and_zip_crc_catches_changed_data(tmp_path):
    w = np.random.default_rng(0).normal(size=(20, 10)).astype(np.float32)
    _legacy_checkpoint(tmp_path / "old.npz", w)
    assert np.array_equal(load_checkpoint(tmp_path / "old.npz")["model"]["w"], w)
    data = (tmp_path / "old.npz").read_bytes()
    at = data.index(w.tobytes()) + 100            # a byte inside the array's data
    (tmp_path / "f.npz").write_bytes(data[:at] + bytes([data[at] ^ 1]) + data[at + 1:])
    with pytest.raises(CheckpointError, match="f.npz.*Bad CRC-32 for file 'model/w.npy'"):
        load_checkpoint(tmp_path / "f.npz")
    # Without the trailer some header bytes (a timestamp) are not checked, but a flip never
    # loads as different numbers: it raises, or the state is exactly what was written.
    for p in np.unique(np.linspace(0, len(data) - 1, 150).astype(int)):
        (tmp_path / "f.npz").write_bytes(data[:p] + bytes([data[p] ^ 0xFF]) + data[p + 1:])
        try:
            back = load_checkpoint(tmp_path / "f.npz")
        except CheckpointError:
            continue
        assert np.array_equal(back["model"]["w"], w) and back["epoch"] == 3, p


# ----------------------------------------------------------------------------- non-finite


def test_non_finite_values_are_refused_and_the_last_good_checkpoint_is_kept(tmp_path):
    good = {"model": {"fc1.weight": np.ones((2, 3), np.float32)}, "epoch": 1}
    first = save_checkpoint(checkpoint_path(tmp_path, 1), good)
    w = np.ones((2, 3), np.float32)
    w[1, 2] = np.nan
    diverged = {"model": {"fc1.weight": w, "fc1.bias": np.array([np.inf])}, "epoch": 2}
    with pytest.raises(CheckpointError) as e:
        save_checkpoint(checkpoint_path(tmp_path, 2), diverged)
    msg = str(e.value)
    assert "refused to write checkpoint-000002.npz: 'model/fc1.weight' holds 1 non-finite " \
        "value(s) (first: nan at index (1, 2)) after epoch 2; 1 more array(s)" in msg, msg
    assert "The run diverged: nothing was written" in msg and f"{first}, is kept" in msg, msg
    assert "allow_nonfinite=True" in msg
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-000001.npz"]
    assert latest_checkpoint(tmp_path) == first
    # On purpose: stored and read back as they are.
    save_checkpoint(tmp_path / "x.npz", diverged, allow_nonfinite=True)
    assert np.isnan(load_checkpoint(tmp_path / "x.npz")["model"]["fc1.weight"][1, 2])
    with pytest.raises(CheckpointError, match="no earlier checkpoint in"):
        save_checkpoint(tmp_path / "empty" / "c.npz", {"w": np.array([np.nan])})


# ----------------------------------------------------------------------------- folder upkeep


def _dead_pid():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_stale_temporary_files_are_removed_but_a_live_writers_file_is_not(tmp_path):
    host, old = socket.gethostname(), time.time() - 2 * 3600
    names = {
        "dead": f".checkpoint-000003.npz.tmp-{host}-{_dead_pid()}",
        "dead_legacy": f".checkpoint-000003.npz.tmp-{_dead_pid()}",     # name without the host
        "live": f".checkpoint-000004.npz.tmp-{host}-{os.getppid()}",
        "other_host_new": ".checkpoint-000004.npz.tmp-elsewhere-1",
        "other_host_old": ".checkpoint-000002.npz.tmp-elsewhere-1",
        "not_ours": ".notes.txt.tmp-1",
    }
    for name in names.values():
        (tmp_path / name).write_bytes(b"partial")
    os.utime(tmp_path / names["other_host_old"], (old, old))
    removed = {p.name for p in remove_stale_temp_files(tmp_path)}
    assert removed == {names["dead"], names["dead_legacy"], names["other_host_old"]}
    left = {p.name for p in tmp_path.iterdir()}
    assert left == {names["live"], names["other_host_new"], names["not_ours"]}
    # The next save cleans up too.
    (tmp_path / names["dead"]).write_bytes(b"partial")
    save_checkpoint(checkpoint_path(tmp_path, 5), {"epoch": 5})
    assert not (tmp_path / names["dead"]).exists()


def test_keep_last_prunes_old_checkpoints_but_never_the_newest_good_one(tmp_path):
    for e in range(1, 6):
        save_checkpoint(checkpoint_path(tmp_path, e), {"epoch": e}, keep_last=2)
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == [
        "checkpoint-000004.npz", "checkpoint-000005.npz"]
    for e in range(1, 4):
        save_checkpoint(checkpoint_path(tmp_path, e), {"epoch": e})
    for e in (4, 5):  # the two newest are damaged: pruning to 2 must keep epoch 3 as well
        checkpoint_path(tmp_path, e).write_bytes(b"PK garbage")
    removed = prune_checkpoints(tmp_path, keep_last=2)
    assert sorted(p.name for p in removed) == ["checkpoint-000001.npz", "checkpoint-000002.npz"]
    assert load_checkpoint(checkpoint_path(tmp_path, 3))["epoch"] == 3
    assert latest_checkpoint(tmp_path) == checkpoint_path(tmp_path, 5)   # damaged, but newest
    with pytest.raises(ValueError, match="keep_last=0"):
        prune_checkpoints(tmp_path, keep_last=0)
    with pytest.raises(ValueError, match="keep_last=0"):
        save_checkpoint(checkpoint_path(tmp_path, 6), {"epoch": 6}, keep_last=0)
    assert not checkpoint_path(tmp_path, 6).exists()
