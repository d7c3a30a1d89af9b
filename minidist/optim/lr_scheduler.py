"""Learning-rate schedules: torch's LRScheduler protocol with closed-form rates.

    sched = WarmupCosine(opt, warmup_steps=100, total_steps=1000, min_lr=1e-5)
    for batch in loader:
        ...; opt.step(); sched.step()          # one sched.step() per optimizer step (or per epoch)

Like torch, constructing a scheduler records each group's ``initial_lr``, sets step 0's rate
and counts ``last_epoch`` from 0; each ``step()`` adds one and writes
``group["lr"] = base_lr * factor(last_epoch)`` (or the absolute rate a schedule defines) into
every parameter group. Rates are computed in closed form from ``last_epoch``, so a restored
``state_dict()`` continues exactly where it stopped.

    WarmupCosine(warmup=4, total=12), lr = 1:
    lr 1.0 |          .--.
           |        /      `.
           |      /          `.
           |    /               `.
           |  /                    `-.___ min_lr
           +--------------------------------> step
             0   warmup=4            total=12
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from minidist.logger import rank_prefix
from minidist.optim.optimizer import Optimizer


class LRScheduler:
    """Base class: subclasses define ``lr_at(base_lr, step)``; ``step()`` applies it.

    Args:
        optimizer: the optimizer whose ``param_groups[i]["lr"]`` this schedule sets.
        last_epoch: the index of the last step taken; -1 starts a new schedule.
    """

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1) -> None:
        if not isinstance(optimizer, Optimizer):
            raise ValueError(f"{rank_prefix()} {type(self).__name__}: expected an Optimizer, "
                             f"got {type(optimizer).__name__}.")
        self.optimizer = optimizer
        for group in optimizer.param_groups:
            if last_epoch == -1:
                group["initial_lr"] = group["lr"]
            elif "initial_lr" not in group:
                raise ValueError(f"{rank_prefix()} {type(self).__name__}: last_epoch={last_epoch} "
                                 "but the optimizer has no 'initial_lr'. Resume by loading the "
                                 "scheduler's state_dict instead, or pass last_epoch=-1.")
        self.base_lrs = [g["initial_lr"] for g in optimizer.param_groups]
        self.last_epoch = last_epoch
        self._last_lr: list[float] = []
        self.step()

    def lr_at(self, base_lr: float, step: int) -> float:  # pragma: no cover - abstract
        """The learning rate of a group whose initial rate is ``base_lr`` at ``step``."""
        raise NotImplementedError

    def get_lr(self) -> list[float]:
        """The rates for the current ``last_epoch``, one per parameter group."""
        return [self.lr_at(base, self.last_epoch) for base in self.base_lrs]

    def step(self) -> None:
        """Advance one step and write the new rate into every parameter group."""
        self.last_epoch += 1
        lrs = self.get_lr()
        for group, lr in zip(self.optimizer.param_groups, lrs):
            group["lr"] = lr
        self._last_lr = list(lrs)

    def get_last_lr(self) -> list[float]:
        """The rates set by the last ``step()``, one per group (as torch)."""
        return list(self._last_lr)

    def state_dict(self) -> dict[str, Any]:
        """Plain numbers only: ``last_epoch``, ``base_lrs``, ``_last_lr`` and the options."""
        return {k: (list(v) if isinstance(v, list) else v) for k, v in self.__dict__.items()
                if k != "optimizer" and not callable(v)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore ``state_dict()`` and re-apply the rate of the restored step to the optimizer.

        Raises:
            ValueError: the number of ``base_lrs`` differs from the optimizer's group count.
        """
        base = state_dict.get("base_lrs", self.base_lrs)
        if len(base) != len(self.optimizer.param_groups):
            raise ValueError(f"{rank_prefix()} {type(self).__name__}.load_state_dict: the checkpoint "
                             f"has {len(base)} base_lrs but the optimizer has "
                             f"{len(self.optimizer.param_groups)} groups. Build the same groups.")
        for k, v in state_dict.items():
            setattr(self, k, list(v) if isinstance(v, (list, tuple)) else v)
        self.last_epoch = int(self.last_epoch)
        for group, lr in zip(self.optimizer.param_groups, self.get_lr()):
            group["lr"] = lr


class LambdaLR(LRScheduler):
    """torch.optim.lr_scheduler.LambdaLR: ``lr = base_lr * lr_lambda(step)``.

    Args:
        optimizer: the optimizer to schedule.
        lr_lambda: a function of the step (or one per group).
        last_epoch: -1 for a new schedule.
    """

    def __init__(self, optimizer: Optimizer,
                 lr_lambda: Callable[[int], float] | list[Callable[[int], float]],
                 last_epoch: int = -1) -> None:
        n = len(optimizer.param_groups)
        lambdas = list(lr_lambda) if isinstance(lr_lambda, (list, tuple)) else [lr_lambda] * n
        if len(lambdas) != n:
            raise ValueError(f"{rank_prefix()} LambdaLR: got {len(lambdas)} lr_lambdas for {n} "
                             "parameter groups. Pass one function, or one per group.")
        self.lr_lambdas = lambdas
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        return [base * fn(self.last_epoch) for base, fn in zip(self.base_lrs, self.lr_lambdas)]

    def state_dict(self) -> dict[str, Any]:
        """As the base class, without the functions (they are code, not data; torch does the same)."""
        return {k: v for k, v in super().state_dict().items() if k != "lr_lambdas"}


class LinearWarmup(LRScheduler):
    """Linear warm-up to the base rate: ``factor = (step + 1) / (warmup_steps + 1)``, then 1.

    The first step already trains (factor 1/(w+1), never 0) and step ``warmup_steps`` runs at
    the full rate; the same ramp as nanoGPT's ``get_lr`` and ``WarmupCosine`` below.

    Args:
        optimizer: the optimizer to schedule.
        warmup_steps: number of steps below the base rate (0 = no warm-up).
        last_epoch: -1 for a new schedule.
    """

    def __init__(self, optimizer: Optimizer, warmup_steps: int, last_epoch: int = -1) -> None:
        if warmup_steps < 0:
            raise ValueError(f"{rank_prefix()} LinearWarmup: warmup_steps={warmup_steps} must be >= 0.")
        self.warmup_steps = int(warmup_steps)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr: float, step: int) -> float:
        if step < self.warmup_steps:
            return base_lr * ((step + 1) / (self.warmup_steps + 1))  # base x factor, as below
        return base_lr


class StepLR(LRScheduler):
    """torch StepLR: ``lr = base_lr * gamma ** (step // step_size)``.

    Args:
        optimizer: the optimizer to schedule.
        step_size: steps between decays.
        gamma: multiplicative decay.
        last_epoch: -1 for a new schedule.
    """

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1,
                 last_epoch: int = -1) -> None:
        if step_size < 1:
            raise ValueError(f"{rank_prefix()} StepLR: step_size={step_size} must be >= 1.")
        self.step_size, self.gamma = int(step_size), float(gamma)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr: float, step: int) -> float:
        return base_lr * self.gamma ** (step // self.step_size)


class CosineAnnealingLR(LRScheduler):
    """torch CosineAnnealingLR (closed form): ``eta_min + (base - eta_min)(1 + cos(pi t/T_max))/2``.

    Args:
        optimizer: the optimizer to schedule.
        T_max: steps of one half cosine (base rate down to ``eta_min``).
        eta_min: the lowest rate.
        last_epoch: -1 for a new schedule.
    """

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0,
                 last_epoch: int = -1) -> None:
        if T_max < 1:
            raise ValueError(f"{rank_prefix()} CosineAnnealingLR: T_max={T_max} must be >= 1.")
        self.T_max, self.eta_min = int(T_max), float(eta_min)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr: float, step: int) -> float:
        cos = 1.0 + math.cos(math.pi * step / self.T_max)
        return self.eta_min + (base_lr - self.eta_min) * cos / 2.0


class WarmupCosine(LRScheduler):
    """Linear warm-up, then cosine decay to ``min_lr`` at ``total_steps``, then ``min_lr``.

    Every rate is ``base_lr x factor(step)`` (the Trainer's schedule, bit for bit)::

        warm-up (step < w):  factor = (step + 1) / (w + 1)
        after:               factor = f + (1 - f) (1 + cos(pi r)) / 2
                             r = min((step - w) / (total - w), 1),  f = min(min_lr / base_lr, 1)

    The curve is nanoGPT's ``get_lr``. Computing ``base_lr x factor`` rather than ``min_lr +
    (base_lr - min_lr) x ...`` keeps one rounding order everywhere, so a run resumed from a
    checkpoint repeats the same rates to the last bit. After ``total_steps`` the rate stays at
    ``base_lr x f`` (``min_lr`` up to rounding); a ``min_lr`` above ``base_lr`` keeps the
    group at ``base_lr`` (``f`` is capped at 1), and a group with ``base_lr`` 0 stays at 0.

    Args:
        optimizer: the optimizer to schedule.
        warmup_steps: steps of linear warm-up.
        total_steps: the step at which the rate reaches ``min_lr``.
        min_lr: the final (absolute) rate.
        last_epoch: -1 for a new schedule.
    """

    def __init__(self, optimizer: Optimizer, warmup_steps: int, total_steps: int,
                 min_lr: float = 0.0, last_epoch: int = -1) -> None:
        if not 0 <= warmup_steps < total_steps:
            raise ValueError(f"{rank_prefix()} WarmupCosine: need 0 <= warmup_steps < total_steps, "
                             f"got warmup_steps={warmup_steps}, total_steps={total_steps}.")
        self.warmup_steps, self.total_steps = int(warmup_steps), int(total_steps)
        self.min_lr = float(min_lr)
        super().__init__(optimizer, last_epoch)

    def factor(self, base_lr: float, step: int) -> float:
        """The multiplier of ``base_lr`` at ``step`` (see the class docstring)."""
        warmup = self.warmup_steps
        if step < warmup:
            return (step + 1) / (warmup + 1)
        floor = min(self.min_lr / base_lr, 1.0) if base_lr > 0 else 0.0
        r = min((step - warmup) / max(self.total_steps - warmup, 1), 1.0)
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * r))

    def lr_at(self, base_lr: float, step: int) -> float:
        return base_lr * self.factor(base_lr, step)


class OneCycleLR(LRScheduler):
    """torch's ``OneCycleLR``: warm up from ``max_lr / div_factor`` to ``max_lr`` over
    ``pct_start`` of the steps, then anneal to ``initial_lr / final_div_factor``; the
    momentum (or Adam's beta1) cycles the other way, ``max_momentum`` -> ``base_momentum``
    -> ``max_momentum``. ``three_phase`` adds torch's symmetric third phase. One ``step()`` per
    batch; stepping past ``total_steps`` raises, as torch.

    Args (torch's, in torch's order):
        optimizer, max_lr (one rate or one per group), total_steps (or epochs and
        steps_per_epoch), pct_start, anneal_strategy ("cos" or "linear"), cycle_momentum,
        base_momentum, max_momentum, div_factor, final_div_factor, three_phase, last_epoch.
    """

    def __init__(self, optimizer: Optimizer, max_lr: Any, total_steps: int | None = None,
                 epochs: int | None = None, steps_per_epoch: int | None = None,
                 pct_start: float = 0.3, anneal_strategy: str = "cos",
                 cycle_momentum: bool = True, base_momentum: Any = 0.85,
                 max_momentum: Any = 0.95, div_factor: float = 25.0,
                 final_div_factor: float = 1e4, three_phase: bool = False,
                 last_epoch: int = -1) -> None:
        name = f"{rank_prefix()} OneCycleLR"
        if total_steps is None:
            if epochs is None or steps_per_epoch is None:
                raise ValueError(f"{name}: pass total_steps, or epochs and steps_per_epoch.")
            total_steps = int(epochs) * int(steps_per_epoch)
        if total_steps <= 0 or not 0 <= pct_start <= 1 or anneal_strategy not in ("cos",
                                                                                 "linear"):
            raise ValueError(f"{name}: need total_steps > 0 (got {total_steps}), 0 <= pct_start "
                             f"<= 1 (got {pct_start}) and anneal_strategy 'cos' or 'linear' "
                             f"(got {anneal_strategy!r}).")
        self.total_steps, self.anneal_strategy = int(total_steps), anneal_strategy
        groups = optimizer.param_groups
        n = len(groups)

        def per_group(v: Any) -> list[float]:
            vs = list(v) if isinstance(v, (list, tuple)) else [v] * n
            if len(vs) != n:
                raise ValueError(f"{name}: got {len(vs)} values for {n} parameter groups.")
            return [float(x) for x in vs]

        if last_epoch == -1:
            for g, top in zip(groups, per_group(max_lr)):
                g["lr"] = top / div_factor  # the base class records it as initial_lr
                g["max_lr"], g["min_lr"] = top, top / div_factor / final_div_factor
        self.cycle_momentum = cycle_momentum
        self.use_beta1 = cycle_momentum and "betas" in groups[0]
        if cycle_momentum:
            if not self.use_beta1 and "momentum" not in groups[0]:
                raise ValueError(f"{name}: cycle_momentum=True needs an optimizer with "
                                 "'momentum' or 'betas'; pass cycle_momentum=False.")
            for g, lo, hi in zip(groups, per_group(base_momentum), per_group(max_momentum)):
                if last_epoch == -1:
                    self._set_momentum(g, hi)
                g["base_momentum"], g["max_momentum"] = lo, hi
        end1 = float(pct_start * self.total_steps) - 1
        if three_phase:
            self.phases = [(end1, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
                           (float(2 * pct_start * self.total_steps) - 2, "max_lr", "initial_lr",
                            "base_momentum", "max_momentum"),
                           (self.total_steps - 1.0, "initial_lr", "min_lr", "max_momentum",
                            "max_momentum")]
        else:
            self.phases = [(end1, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
                           (self.total_steps - 1.0, "max_lr", "min_lr", "base_momentum",
                            "max_momentum")]
        super().__init__(optimizer, last_epoch)

    def _set_momentum(self, group: dict[str, Any], value: float) -> None:
        if self.use_beta1:
            group["betas"] = (value, *tuple(group["betas"])[1:])
        else:
            group["momentum"] = value

    def _anneal(self, start: float, end: float, pct: float) -> float:
        if self.anneal_strategy == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def get_lr(self) -> list[float]:
        step = self.last_epoch
        if step > self.total_steps:
            raise ValueError(f"{rank_prefix()} OneCycleLR: tried to step {step} times; "
                             f"total_steps is {self.total_steps} (as torch, stepping past "
                             "the end raises). Pass a larger total_steps.")
        lrs = []
        for g in self.optimizer.param_groups:
            start = 0.0
            for i, (end, lr0, lr1, m0, m1) in enumerate(self.phases):
                if step <= end or i == len(self.phases) - 1:
                    pct = (step - start) / (end - start)
                    lrs.append(self._anneal(g[lr0], g[lr1], pct))
                    if self.cycle_momentum:
                        self._set_momentum(g, self._anneal(g[m0], g[m1], pct))
                    break
                start = end
        return lrs
