"""Trainer in one process: config checks, History JSON, a short run, resume (skipping damaged
checkpoints), a diverged run stopped at its checkpoint, keep_last."""

import json
import logging

import numpy as np
import pytest

import minidist
from minidist import nn, optim
from minidist.checkpoint import CheckpointError
from minidist.data import ArrayDataset
from minidist.trainer import History, Trainer, TrainerConfig, TrainingDiverged


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


@pytest.fixture
def warnings_seen():
    """The messages the "minidist" logger emits at WARNING and above during the test."""
    seen = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: seen.append(record.getMessage())
    logger = logging.getLogger("minidist")
    logger.addHandler(handler)
    yield seen
    logger.removeHandler(handler)


def _train_with_checkpoints(tmp_path, epochs):
    cfg = TrainerConfig(epochs=epochs, batch_size=16, checkpoint_dir=str(tmp_path),
                        checkpoint_every_n_epochs=1, verbose=False)
    t = make(cfg)
    t.fit(blobs())
    t.ddp.close()
    return cfg


def test_resume_skips_a_damaged_newest_checkpoint(group, tmp_path, warnings_seen):
    cfg = _train_with_checkpoints(tmp_path, 3)
    for e, cut in ((3, 100), (2, -1)):  # a truncated newest, then one with a changed byte
        p = tmp_path / f"checkpoint-00000{e}.npz"
        data = p.read_bytes()
        p.write_bytes(data[:cut] if cut > 0 else data[:500] + b"X" + data[501:])
    stale = tmp_path / ".checkpoint-000004.npz.tmp-1234567890"   # a crashed writer's leftover
    stale.write_bytes(b"partial")
    cfg.resume, cfg.epochs = True, 4
    t = make(cfg)
    t.fit(blobs())
    t.ddp.close()
    assert t.start_epoch == 1
    skipped = [m for m in warnings_seen if m.startswith("resume: skipped")]
    assert len(skipped) == 2, warnings_seen
    assert "checkpoint-000003.npz: BadZipFile" in skipped[0], skipped
    assert "checkpoint-000002.npz: its CRC-32 is" in skipped[1], skipped
    assert not stale.exists()


def test_resume_refuses_when_no_checkpoint_loads(group, tmp_path):
    cfg = _train_with_checkpoints(tmp_path, 2)
    for p in tmp_path.glob("checkpoint-*.npz"):
        p.write_bytes(p.read_bytes()[:100])
    cfg.resume, cfg.epochs = True, 3
    t = make(cfg)
    before = [x.array.copy() for x in t.model.parameters()]
    with pytest.raises(CheckpointError, match=r"none of the 2 checkpoints in .* loads: "
                       r"checkpoint-000002.npz \(BadZipFile.*\); checkpoint-000001.npz"):
        t.fit(blobs())
    assert all((a == x.array).all() for a, x in zip(before, t.model.parameters()))
    t.ddp.close()


class PoisonedLoss(nn.CrossEntropyLoss):
    """Cross-entropy that writes a NaN into the model at its ``at``-th call (a diverging run)."""

    def __init__(self, model, at):
        super().__init__()
        self.model, self.at, self.calls = model, at, 0

    def forward(self, logits, target):
        self.calls += 1
        if self.calls == self.at:
            next(iter(self.model.parameters())).array[0, 0] = np.nan
        return super().forward(logits, target)


def test_a_diverged_run_stops_at_its_next_checkpoint_and_keeps_the_last_good_one(group,
                                                                                   tmp_path):
    minidist.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 3))
    cfg = TrainerConfig(epochs=4, batch_size=16, checkpoint_dir=str(tmp_path),
                        checkpoint_every_n_epochs=1, checkpoint_keep_last=2, verbose=False,
                        allow_nonfinite=True)  # train on through the NaN: the save refuses it
    t = Trainer(model, PoisonedLoss(model, at=20), optim.SGD(model.parameters(), lr=0.1), cfg)
    with pytest.raises(CheckpointError, match=r"refused to write checkpoint-000003.npz: "
                       r"'model/0.weight' holds .* after epoch 3; .* The run diverged.*"
                       r"checkpoint-000002.npz, is kept"):
        t.fit(blobs())          # 8 steps per epoch: the NaN comes in epoch 3
    t.ddp.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint-000001.npz", "checkpoint-000002.npz"]


def test_a_diverged_run_stops_at_the_nan_step_by_default(group, tmp_path):
    minidist.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 3))
    cfg = TrainerConfig(epochs=4, batch_size=16, checkpoint_dir=str(tmp_path),
                        checkpoint_every_n_epochs=1, verbose=False)
    t = Trainer(model, PoisonedLoss(model, at=20), optim.SGD(model.parameters(), lr=0.1), cfg)
    with pytest.raises(TrainingDiverged, match=r"non-finite \(NaN/inf\) averaged gradient at "
                       r"step 20 in \[.*'0.weight'.*allow_nonfinite=True"):
        t.fit(blobs())          # the NaN comes at step 20, in epoch 3
    t.ddp.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint-000001.npz", "checkpoint-000002.npz"]  # stopped before a NaN could be saved


def test_checkpoint_keep_last_bounds_the_folder(group, tmp_path):
    cfg = TrainerConfig(epochs=4, batch_size=16, checkpoint_dir=str(tmp_path),
                        checkpoint_every_n_epochs=1, checkpoint_keep_last=2, verbose=False)
    t = make(cfg)
    t.fit(blobs())
    t.ddp.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint-000003.npz", "checkpoint-000004.npz", "history.json"]
    with pytest.raises(ValueError, match="checkpoint_keep_last=0"):
        TrainerConfig(checkpoint_keep_last=0).validate()


def test_lr_scaling_is_visible_as_lr_scale_and_in_the_optimizer(group):
    """The Trainer rescales the optimizer's rates in place, once; the factor is public (the
    2-rank value and its log line: tests/test_examples.py, the resume test)."""
    from minidist import comm, nn, optim
    from minidist.trainer import Trainer, TrainerConfig

    model = nn.Linear(2, 2)
    opt = optim.SGD(model.parameters(), lr=0.1)
    trainer = Trainer(model, nn.CrossEntropyLoss(), opt,
                      TrainerConfig(lr_scaling="linear", verbose=False))
    assert trainer.lr_scale == comm.get_world_size() == 1
    assert opt.param_groups[0]["lr"] == 0.1 * trainer.lr_scale
    trainer.ddp.close()
