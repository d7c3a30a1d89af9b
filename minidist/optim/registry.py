"""What a fused optimizer step tells the kernels: one ``FusedStep`` entry per element function.

    SGD_MOMENTUM = register(FusedStep("sgd_momentum", sgd_momentum_element,
                                      state=("momentum_buffer",), scalars=sgd_momentum_scalars))

    class SGD(Optimizer):
        def fused_kernel(self, group):            # which entry updates this group
            return SGD_MOMENTUM if group["momentum"] != 0 else SGD_PLAIN

Each optimizer module ends with its entries; ``FUSED_STEPS`` lists every registered one (name
-> entry), and everything that runs fused steps works from an entry alone: ``fused.step`` (the
step: parameters grouped into flat runs or one multi-tensor table, state allocated flat on the
first step, scalars computed once per batch), the Numba CPU and CUDA backends (which build
their loops from ``entry.element``: ``kernels/optim_cpu.py``, ``kernels/optim_cuda.py``), the
whole-array reference (``kernels/optim_math.py``), the simulator and PTX tests (every entry).
A new optimizer with a fused kernel is its module (class, element function, entry) plus its
line in ``minidist/optim/__init__.py``.

An entry's fields:

    name         unique; names its compiled kernels and their rehearsal
    element      element(p, g, *state, *scalars) -> (new_p, *new_state): one element, scalars
                 of the parameter's dtype (the contract: ``minidist/kernels/optim_math.py``)
    state        the names of the per-parameter state arrays, in the element's order; they
                 start as zeros (allocated flat, one buffer per name) and are the keys of
                 ``state_dict()["state"][i]``
    scalars      scalars(group, step, first) -> the element's scalars as Python numbers (cast
                 to the parameter's dtype; bools stay bools): computed once per batch of
                 parameters that share the group, ``step`` and ``first``
    counts_steps the state keeps torch's ``"step"`` (an int, the number of updates so far);
                 ``step`` is then this update's number (1, 2, ...), otherwise 0
    ``first`` is True on a parameter's first update (its state arrays were just made).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from minidist.logger import get_logger

log = get_logger(__name__)

__all__ = ["FusedStep", "FUSED_STEPS", "register"]

Scalars = Callable[[dict[str, Any], int, bool], tuple[Any, ...]]


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: kernels are cached per entry
class FusedStep:
    """One fused optimizer step of the registry (see the module docstring for each field)."""

    name: str
    element: Callable[..., tuple[Any, ...]]
    scalars: Scalars
    state: tuple[str, ...] = ()
    counts_steps: bool = False


FUSED_STEPS: dict[str, FusedStep] = {}


def register(entry: FusedStep) -> FusedStep:
    """Add ``entry`` to ``FUSED_STEPS`` under its name (a later entry of the same name, e.g.
    a module reloaded, replaces it) and return it."""
    if entry.name in FUSED_STEPS:
        log.debug("fused step %r registered again: the new entry replaces the old one",
                  entry.name)
    FUSED_STEPS[entry.name] = entry
    return entry
