"""Bad inputs to training and checkpoints are named at once, with the cause and the fix (one
process): an empty dataset, float16 weights without amp, an unwritable or full checkpoint
folder, a stray file named like a checkpoint, damaged checkpoints at resume."""

import logging
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import minidist
from minidist import nn, optim
from minidist.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from minidist.data import ArrayDataset
from minidist.trainer import Trainer, TrainerConfig
from procs import REPO, job_env


def blobs(n=64, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    x = (rng.normal(size=(n, 5)) + 5 * np.eye(3, 5)[y]).astype(dtype)
    return ArrayDataset(x, y.astype(np.int64))


def make(cfg, opt=optim.SGD, **kw):
    minidist.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))
    return Trainer(model, nn.CrossEntropyLoss(), opt(model.parameters(), **kw), cfg)


@pytest.fixture
def warnings_seen():
    seen = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: seen.append(record.getMessage())
    logging.getLogger("minidist").addHandler(handler)
    yield seen
    logging.getLogger("minidist").removeHandler(handler)


def test_an_empty_dataset_is_an_error(group, tmp_path):
    t = make(TrainerConfig(epochs=1, batch_size=8, checkpoint_dir=str(tmp_path / "c"),
                           verbose=False), lr=0.1)
    with pytest.raises(ValueError, match=r"training dataset is empty \(0 samples\)"):
        t.fit(ArrayDataset(np.zeros((0, 5), np.float32), np.zeros(0, np.int64)))
    t.ddp.close()
    assert not list((tmp_path / "c").glob("checkpoint-*"))  # nothing "trained", nothing saved


def test_float16_weights_without_amp_name_the_optimizer_eps(group):
    minidist.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3)).to(minidist.float16)
    t = Trainer(model, nn.CrossEntropyLoss(), optim.AdamW(model.parameters()),
                TrainerConfig(epochs=1, batch_size=8, verbose=False))
    with pytest.raises(ValueError, match=r"AdamW's eps=1e-08 rounds to 0 in float16") as e:
        t.fit(blobs(dtype=np.float16))
    assert "amp=True" in str(e.value)
    t.ddp.close()


def test_an_unwritable_checkpoint_dir_is_found_before_the_first_step(group, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    t = make(TrainerConfig(epochs=1, batch_size=8, checkpoint_dir=str(blocker / "runs"),
                           verbose=False), lr=0.1)
    before = [p.array.copy() for p in t.model.parameters()]
    with pytest.raises(CheckpointError, match=r"cannot be written \(ENOTDIR"):
        t.fit(blobs())
    t.ddp.close()
    assert all((p.array == b).all() for p, b in zip(t.model.parameters(), before))  # no step


def test_a_disk_that_refuses_the_write_gives_one_clean_error(tmp_path):
    """A file-size limit makes the kernel refuse the write (as a full disk does): one
    CheckpointError naming the file, the errno and the fix, no chained tracebacks, no temp
    file left, the previous checkpoint kept."""
    script = textwrap.dedent(f"""
        import resource, signal, sys, traceback
        import numpy as np
        from minidist.checkpoint import save_checkpoint
        save_checkpoint({str(tmp_path / "checkpoint-000001.npz")!r}, {{"w": np.zeros(4)}})
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        try:
            save_checkpoint({str(tmp_path / "checkpoint-000002.npz")!r}, {{"w": np.zeros(4096)}})
        except Exception:
            traceback.print_exc()
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            env=job_env(), cwd=str(REPO), timeout=60)
    err = result.stderr
    assert err.count("Traceback") == 1 and "During handling" not in err, err
    assert "could not write" in err and "EFBIG" in err and "Fix:" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-000001.npz"]


@pytest.mark.parametrize("content", ["pickle", "object-npy"])
def test_a_stray_file_never_gets_unsafe_loading_advice(tmp_path, content):
    path = tmp_path / "checkpoint-000001.npz"
    if content == "pickle":
        path.write_bytes(pickle.dumps({"model": [1, 2]}))
    else:
        with open(path, "wb") as f:
            np.save(f, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(path)
    assert "allow_pickle" not in str(e.value) and "pickled Python objects" in str(e.value)


def test_damaged_checkpoints_are_set_aside_not_overwritten(group, tmp_path, warnings_seen):
    cfg = TrainerConfig(epochs=3, batch_size=16, checkpoint_dir=str(tmp_path),
                        checkpoint_every_n_epochs=1, verbose=False)
    t = make(cfg, lr=0.1)
    t.fit(blobs())
    t.ddp.close()
    newest = tmp_path / "checkpoint-000003.npz"
    damaged = newest.read_bytes()[:100]
    newest.write_bytes(damaged)
    cfg.resume, cfg.epochs = True, 3
    t = make(cfg, lr=0.1)
    t.fit(blobs())  # resumes from epoch 2 and writes checkpoint-000003.npz again
    t.ddp.close()
    aside = tmp_path / "checkpoint-000003.npz.damaged"
    assert aside.read_bytes() == damaged  # kept as it was, under a name that says so
    load_checkpoint(newest)  # the resumed run's own
    assert any("set the damaged checkpoint-000003.npz aside" in m for m in warnings_seen)


def test_save_into_a_file_path_names_the_folder(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(CheckpointError, match=r"could not write .* \(EEXIST: File exists\)"):
        save_checkpoint(blocker / "checkpoint-000001.npz", {"w": np.zeros(2)})


def test_calling_the_inner_model_instead_of_ddp_is_named_at_that_backward(group):
    """DDP(model), then model(x) instead of ddp(x): the buckets never see that backward, so
    its gradients would never be averaged. The reducer's hook finds it at once, naming a
    parameter; plain steps, no_sync accumulation and no_grad forwards of the inner model pass."""
    minidist.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))
    ddp = minidist.DistributedDataParallel(model)
    opt = optim.SGD(model.parameters(), lr=0.1)
    x = minidist.Tensor(np.ones((4, 5), np.float32))
    try:
        for _ in range(2):
            opt.zero_grad()
            with ddp.no_sync():
                ddp(x).sum().backward()
            ddp(x).sum().backward()
            opt.step()
            with minidist.no_grad():
                model(x)
        opt.zero_grad()
        with pytest.raises(RuntimeError, match=r"parameter '[\w.]+' got a gradient .*"
                                               r"model\(x\) instead of ddp\(x\)"):
            model(x).sum().backward()
    finally:
        ddp.close()
