"""optim.WarmupCosine and LinearWarmup are the Trainer's schedule, bit for bit.

The oracle is the multiplier the Trainer used to build with LambdaLR (kept here verbatim): any
difference in the last bit would change a resumed run's weights, so the rates must be ``==``.
"""

import math

import numpy as np
import pytest

import minidist.optim as optim
from minidist.nn import Parameter


def trainer_factor(base_lr, warmup, total_steps, min_lr, cosine):
    """The Trainer's former LambdaLR multiplier (minidist/trainer.py before WarmupCosine)."""
    floor = min(min_lr / base_lr, 1.0) if base_lr > 0 else 0.0

    def factor(step):
        if step < warmup:
            return (step + 1) / (warmup + 1)
        if not cosine:
            return 1.0
        r = min((step - warmup) / max(total_steps - warmup, 1), 1.0)
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * r))
    return factor


def new_opt(lrs):
    groups = [{"params": [Parameter(np.zeros(2, np.float32))], "lr": lr} for lr in lrs]
    return optim.SGD(groups, lr=lrs[0])


def rates(sched, steps):
    out = [[g["lr"] for g in sched.optimizer.param_groups]]
    for _ in range(steps):
        sched.step()
        out.append([g["lr"] for g in sched.optimizer.param_groups])
    return out


CASES = [  # (group lrs, warmup, total, min_lr)
    ([0.1], 0, 1, 0.0), ([0.1], 5, 100, 1e-4), ([0.012, 0.003], 37, 938, 1e-5),
    ([3e-4], 100, 5000, 3e-5), ([0.05, 0.0], 7, 61, 0.001), ([1e-3], 3, 40, 0.01),  # min > base
    ([0.4], 0, 733, 0.0), ([0.7, 0.1, 2.5], 12, 400, 0.02),
]


@pytest.mark.parametrize("lrs,warmup,total,min_lr", CASES)
def test_warmup_cosine_equals_the_trainer_expression_bit_for_bit(lrs, warmup, total, min_lr):
    mine = rates(optim.WarmupCosine(new_opt(lrs), warmup, total, min_lr), total + 5)
    oracle = rates(optim.LambdaLR(new_opt(lrs), [trainer_factor(lr, warmup, total, min_lr, True)
                                                 for lr in lrs]), total + 5)
    assert mine == oracle  # exact: not approx


@pytest.mark.parametrize("lrs,warmup", [([0.1], 0), ([0.1], 9), ([0.012, 0.003], 37)])
def test_linear_warmup_equals_the_trainer_constant_schedule(lrs, warmup):
    mine = rates(optim.LinearWarmup(new_opt(lrs), warmup), warmup + 5)
    oracle = rates(optim.LambdaLR(new_opt(lrs), [trainer_factor(lr, warmup, 0, 0.0, False)
                                                 for lr in lrs]), warmup + 5)
    assert mine == oracle


def test_the_old_formula_would_differ():
    """Why this matters: min_lr + (base - min_lr)(1 + cos)/2 rounds differently now and then."""
    base, w, total, min_lr = 0.012, 37, 938, 1e-5
    f = trainer_factor(base, w, total, min_lr, True)
    differ = sum(base * f(s) != min_lr + (base - min_lr) * (1.0 + math.cos(
        math.pi * (s - w) / (total - w))) / 2.0 for s in range(w, total))
    assert differ > 0


def _fit(tmp_path, epochs, resume=False, schedule="cosine"):
    import minidist
    from minidist import nn
    from minidist.data import ArrayDataset
    from minidist.trainer import Trainer, TrainerConfig

    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 64)
    x = (rng.normal(size=(64, 5)) + 5 * np.eye(3, 5)[y]).astype(np.float32)
    minidist.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))
    cfg = TrainerConfig(epochs=epochs, batch_size=16, schedule=schedule, warmup_steps=3,
                        min_lr=1e-3, checkpoint_dir=str(tmp_path), checkpoint_every_n_epochs=1,
                        resume=resume, verbose=False)
    t = Trainer(model, nn.CrossEntropyLoss(), optim.SGD(model.parameters(), lr=0.1), cfg)
    t.fit(ArrayDataset(x, y.astype(np.int64)))
    t.ddp.close()
    return t


def test_the_trainer_runs_warmup_cosine_and_resumes_with_its_own_total(group, tmp_path):
    t = _fit(tmp_path, epochs=2)
    assert type(t.scheduler) is optim.WarmupCosine
    assert (t.scheduler.warmup_steps, t.scheduler.total_steps) == (3, 8)  # 4 steps per epoch
    assert t.scheduler.last_epoch == 8
    # Train longer: the position comes from the checkpoint, the shape from the new config.
    longer = _fit(tmp_path, epochs=3, resume=True)
    assert (longer.scheduler.total_steps, longer.scheduler.last_epoch) == (12, 12)
    assert longer.optimizer.param_groups[0]["lr"] == longer.scheduler.lr_at(0.1, 12)
    constant = _fit(tmp_path / "c", epochs=1, schedule="constant")
    assert type(constant.scheduler) is optim.LinearWarmup
