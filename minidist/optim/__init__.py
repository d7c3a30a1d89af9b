"""Optimizers, learning-rate schedules and gradient clipping, with torch's names and formulas.

    from minidist import optim
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = optim.WarmupCosine(opt, warmup_steps=50, total_steps=1000)
    for x, y in loader:
        loss = loss_fn(model(x), y)
        opt.zero_grad(); loss.backward()
        optim.clip_grad_norm_(model.parameters(), 1.0)
        opt.step(); sched.step()

Modules: ``optimizer`` (base class: groups, state_dict), ``param_state`` (its state; how to
write one torch's way), ``inplace`` (an element function run in place), ``sgd``, ``adam``
(Adam, AdamW, amsgrad), ``adadelta``, ``adagrad``, ``rmsprop``, ``options`` (their shared
checks), ``lr_scheduler``, ``fused`` (``fused=True`` steps, ``flatten_parameters``),
``registry`` (``FusedStep``: one entry per fused element function; ``FUSED_STEPS`` lists them,
filled as each optimizer module is imported below); ``clip_grad_norm_`` is the tensor layer's
(``minidist.tensor.clip_grad``), the same function as ``nn.utils.clip_grad_norm_``. Every update
works in place on ``param.array``.
"""

from minidist.optim.adadelta import Adadelta
from minidist.optim.adagrad import Adagrad
from minidist.optim.adam import Adam, AdamW
from minidist.optim.fused import flatten_parameters
from minidist.optim.rmsprop import RMSprop
from minidist.tensor import clip_grad_norm_, clip_grad_value_  # one implementation (tensor)
from minidist.optim.lr_scheduler import (
    CosineAnnealingLR,
    LambdaLR,
    LinearWarmup,
    LRScheduler,
    OneCycleLR,
    StepLR,
    WarmupCosine,
)
from minidist.optim.optimizer import Optimizer
from minidist.optim.registry import FUSED_STEPS, FusedStep, register
from minidist.optim.sgd import SGD

__all__ = ["Optimizer", "FusedStep", "FUSED_STEPS", "register", "SGD", "Adam", "AdamW", "Adadelta", "Adagrad", "RMSprop", "flatten_parameters", "clip_grad_norm_", "clip_grad_value_", "LRScheduler", "LambdaLR",
           "LinearWarmup", "StepLR", "CosineAnnealingLR", "WarmupCosine", "OneCycleLR"]
