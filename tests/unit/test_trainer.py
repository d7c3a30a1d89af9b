"""Trainer in one process: config checks, History JSON, a short run, resume errors."""

import json

import numpy as np
import pytest

import minidist
from minidist import nn, optim
from minidist.checkpoint import CheckpointError
from minidist.data import ArrayDataset
from minidist.trainer import History, Trainer, TrainerConfig


def blobs(n=120, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    x = (rng.normal(size=(n, 5)) + 5 * np.eye(3, 5)[y]).astype(np.float32)
    return ArrayDataset(x, y.astype(np.int64))


def make(cfg):
    minidist.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 3))
    return Trainer(model, nn.CrossEntropyLoss(), optim.SGD(model.parameters(), lr=0.1), cfg)


@pytest.mark.parametrize("field,value,match", [
    ("epochs", 0, "epochs=0"), ("lr_scaling", "cubic", "lr_scaling='cubic'"),
    ("validation_split", 1.0, "validation_split"), ("grad_accum_steps", 0, "grad_accum"),
    ("checkpoint_every_n_epochs", 1, "checkpoint_dir=None"), ("schedule", "step", "schedule"),
])
def test_config_errors_name_the_field(field, value, match):
    with pytest.raises(ValueError, match=match):
        TrainerConfig(**{field: value}).validate()


def test_history_json_roundtrip(tmp_path):
    h = History(train_losses=[1.0, 0.5], world_size=2, effective_batch_size=64)
    h.to_json(tmp_path / "h.json")
    back = History.from_dict(json.loads((tmp_path / "h.json").read_text()))
    assert back == h


def test_fit_learns_and_reports(group, tmp_path):
    cfg = TrainerConfig(epochs=3, batch_size=16, validation_split=0.25, schedule="cosine",
                        warmup_epochs=0.5, grad_accum_steps=2, checkpoint_dir=str(tmp_path),
                        checkpoint_every_n_epochs=2, verbose=False)
    t = make(cfg)
    h = t.fit(blobs())
    assert len(h.train_losses) == 3 and len(h.val_accuracies) == 3
    assert h.train_losses[-1] < h.train_losses[0] and h.val_accuracies[-1] > 0.8
    assert h.effective_batch_size == 32 and h.world_size == 1 and h.samples_per_second > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint-000002.npz", "checkpoint-000003.npz", "history.json"]
    loss, acc = t.evaluate(blobs(50, seed=1))
    assert 0 <= acc <= 1 and loss > 0
    t.ddp.close()


def test_resume_from_a_truncated_checkpoint_is_refused(group, tmp_path):
    cfg = TrainerConfig(epochs=2, batch_size=16, checkpoint_dir=str(tmp_path),
                        checkpoint_every_n_epochs=1, verbose=False)
    t = make(cfg)
    t.fit(blobs())
    t.ddp.close()
    p = tmp_path / "checkpoint-000002.npz"
    p.write_bytes(p.read_bytes()[:100])
    cfg.resume, cfg.epochs = True, 3
    t = make(cfg)
    before = [x.data.copy() for x in t.model.parameters()]
    with pytest.raises(CheckpointError, match="checkpoint-000002.npz"):
        t.fit(blobs())
    assert all((a == x.data).all() for a, x in zip(before, t.model.parameters()))
    t.ddp.close()
