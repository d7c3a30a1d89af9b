"""The wings: what minidist adds to its textbook spine, and which of them a process loads.

    MINIDIST_WINGS unset (or all)   the spine and every wing: minidist as documented
    MINIDIST_WINGS=none             the spine alone (examples/train_spine.py trains with it)
    MINIDIST_WINGS=tcp,auto         the spine and those wings (and the wings they need)

The spine is what a learner reads: the tensor and its autograd, the layers, losses and
optimizers, sampler and loader, the process group over the MPI and thread transports, the
textbook all-reduces (direct, ring, tree, rd), and DDP. A wing is a package that attaches to
the spine only through its seams (the algorithm registry, the group extensions, the planner's
chooser and stagers, the backends' transports), when it is imported: the package root
(minidist/__init__.py) imports each enabled wing in ``WINGS`` order, the same on every rank.
The spine never imports a wing (an import-linter contract in pyproject.toml checks it).

    wing      modules                          what it adds, and how it attaches
    watch     minidist.watch                   the ledger, the failure diagnosis and handling
                                               (group extensions, the job hooks)
    fastpath  minidist.fastpath                "mpi", "shm", "hier", "cuda_ipc", ... (the
                                               algorithm registry); the node's shared memory
                                               (group extensions); device staging (stagers)
    tcp       minidist.tcp, minidist.launch    the "tcp" backend (the backends' transports);
                                               ``python -m minidist.launch``
    auto      minidist.auto, minidist.tune     the planner's chooser for algorithm="auto",
                                               calibrations (group extensions)
    amp       minidist.amp                     autocast, GradScaler, MasterWeights (DDP hears
                                               a scaler through optim/grad_scaling.py)
    training  minidist.trainer, .checkpoint    Trainer, History, atomic checkpoints
    memory    minidist.memory, minidist.utils  ZeRO-1 (minidist.ddp.ZeroRedundancyOptimizer),
                                               activation checkpointing, the memory report
    torch     minidist.distributed, .backends, torch's namespaces by their paths
              .multiprocessing
    tools     minidist.viz, minidist.testing   message pictures; the cluster emulator, SLURM

The root package imports a loaded wing's public names (``minidist.Trainer``, ``minidist.amp``);
without the wing they are not there, and a script that needs them fails at its import.
"""

from __future__ import annotations

import importlib
from typing import Mapping

from minidist.envvars import env

# name -> (its modules and packages, the wings it needs), in load order
WINGS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "watch": (("minidist.watch",), ()),
    "fastpath": (("minidist.fastpath",), ()),
    "tcp": (("minidist.tcp", "minidist.launch"), ()),
    "auto": (("minidist.auto", "minidist.tune"), ("fastpath",)),
    "amp": (("minidist.amp",), ()),
    "training": (("minidist.trainer", "minidist.checkpoint"), ("amp", "watch")),
    "memory": (("minidist.memory", "minidist.utils"), ()),
    "torch": (("minidist.distributed", "minidist.backends", "minidist.multiprocessing"),
              ("memory",)),
    "tools": (("minidist.testing", "minidist.viz"), ("auto",)),
}


# The algorithms a wing registers (minidist.comm.algorithms.register), so that asking for one
# without its wing names the wing (tests/test_spine.py holds this table to the registry)
ALGORITHM_WINGS = {name: "fastpath" for name in
                   ("mpi", "shm", "hier", "cuda_ipc", "host_copy", "ipc_host")}


def enabled(environ: Mapping[str, str] | None = None) -> list[str]:
    """The wings ``MINIDIST_WINGS`` asks for, with the wings they need, in ``WINGS`` order.

        >>> enabled({"MINIDIST_WINGS": "none"})
        []
        >>> enabled({"MINIDIST_WINGS": "auto"})
        ['fastpath', 'auto']

    Raises:
        ValueError: a name that is not a wing (the message lists them).
    """
    asked = env("MINIDIST_WINGS", environ)
    if asked == ("all",):
        return list(WINGS)
    if asked == ("none",):
        return []
    unknown = [n for n in asked if n not in WINGS]
    if unknown:
        raise ValueError(f"MINIDIST_WINGS={','.join(asked)}: {', '.join(unknown)} is not a wing; "
                         f"use all, none, or names from: {', '.join(WINGS)}")
    wanted: set[str] = set()
    todo = list(asked)
    while todo:
        name = todo.pop()
        if name not in wanted:
            wanted.add(name)
            todo.extend(WINGS[name][1])
    return [n for n in WINGS if n in wanted]


def load(environ: Mapping[str, str] | None = None) -> list[str]:
    """Import the enabled wings (each attaches itself); return their names."""
    names = enabled(environ)
    for name in names:
        importlib.import_module(WINGS[name][0][0])  # the first attaches the wing
    return names


def is_wing_module(module: str) -> str | None:
    """The wing ``module`` (a dotted name) belongs to, or None for the spine."""
    for name, (packages, _) in WINGS.items():
        if any(module == p or module.startswith(p + ".") for p in packages):
            return name
    return None


__all__ = ["WINGS", "ALGORITHM_WINGS", "enabled", "load", "is_wing_module"]
