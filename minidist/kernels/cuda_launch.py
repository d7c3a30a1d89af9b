"""How a launch plan launches: Numba's dispatcher configured quietly, the pre-packed launch,
the plan counters.

``minidist.kernels.cuda`` builds its ``LaunchPlan`` from these: the first launch goes through
the dispatcher (``configure_quietly``), later ones through the compiled kernel, packed once
where Numba allows it (``PackedLaunch``); ``PlanStats`` counts what was built and how each
launch went.
"""

from __future__ import annotations

import sys
import threading
import warnings
from typing import Any

import numpy as np


class PlanStats:
    """Counters of the plan caches (tests check that a second call builds nothing)."""

    def __init__(self) -> None:
        self.plans_built = 0
        self.views_built = 0
        self.streams_built = 0
        self.launches = 0
        self.direct_launches = 0
        self.packed_launches = 0

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


def _is_scalar(value: Any) -> bool:
    return isinstance(value, (bool, int, float, np.number))


class PackedLaunch:
    """A compiled kernel's handle with its array arguments packed ONCE, by the compiled
    kernel's own ``_prepare_args`` (so the bytes are what Numba's launch would pass); per call
    only the scalars are packed, then the launch goes straight to ``cuda.core``'s ``launch``.

    Built only where Numba exposes exactly that (numba-cuda 0.30: ``launch`` and
    ``LaunchConfig`` in the compiled kernel's module, no debug, no extensions, not
    cooperative); anything else raises here and the plan keeps the compiled kernel's
    ``launch``.
    """

    def __init__(self, compiled: Any, args: tuple[Any, ...], griddim: Any, blockdim: Any,
                 stream: Any) -> None:
        import sys

        module = sys.modules[type(compiled).__module__]
        if compiled.debug or compiled.extensions or getattr(compiled, "cooperative", False):
            raise TypeError("debug, extensions or cooperative launches are packed per call")
        self.launch_fn, self.compiled, self.stream = module.launch, compiled, stream
        self.kernel = compiled._codelibrary.get_cufunc().kernel
        self.config = module.LaunchConfig(grid=griddim, block=blockdim, shmem_size=0)
        self.types = tuple(compiled.argument_types)
        self.fixed = args
        self.parts: list[list | None] = []
        for ty, value in zip(self.types, args):
            if _is_scalar(value):
                self.parts.append(None)  # packed at every call
                continue
            packed: list[Any] = []
            written_back: list[Any] = []
            compiled._prepare_args(ty, value, stream, written_back, packed)
            if written_back:  # a host array would need a copy back: not a fixed argument
                raise TypeError("argument needs a copy back")
            self.parts.append(packed)

    def __call__(self, args: tuple[Any, ...]) -> bool:
        """Launch; False (nothing launched) when an array argument is not the packed one."""
        kernelargs: list[Any] = []
        for part, ty, value, fixed in zip(self.parts, self.types, args, self.fixed):
            if part is None:
                self.compiled._prepare_args(ty, value, self.stream, [], kernelargs)
            elif value is fixed or (type(value) is tuple and len(value) == len(fixed)
                                    and all(a is b for a, b in zip(value, fixed))):
                kernelargs.extend(part)
            else:
                return False
        self.launch_fn(self.stream, self.config, self.kernel, *kernelargs)
        return True


_CONFIGURE_LOCK = threading.Lock()


def configure_quietly(kernel: Any, blocks: int, threads: int, stream: Any) -> Any:
    """``kernel[blocks, threads, stream]`` without Numba's low-occupancy warning.

    Numba decides that warning once per configuration, when ``kernel[...]`` is built, from
    ``config.CUDA_LOW_OCCUPANCY_WARNINGS`` of its dispatcher's module (grids under 128 blocks
    warn). Small grids are chosen here (one thread updates the loss scale; a small buffer
    needs few blocks), so the flag is off while THIS configuration is built and restored
    right after: the user's own launches still warn. A Numba that decides it elsewhere is
    covered by a warnings filter around the configuration as well.
    """
    config: Any = getattr(sys.modules.get(type(kernel).__module__), "config", None)
    flag: Any = getattr(config, "CUDA_LOW_OCCUPANCY_WARNINGS", 0) if config is not None else 0
    with _CONFIGURE_LOCK, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Grid size \d+ will likely result in GPU "
                                "under-utilization")
        if flag:
            config.CUDA_LOW_OCCUPANCY_WARNINGS = 0
        try:
            return kernel[blocks, threads, stream]
        finally:
            if flag:
                config.CUDA_LOW_OCCUPANCY_WARNINGS = flag
