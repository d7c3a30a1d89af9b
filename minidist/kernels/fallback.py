"""Load a compiled kernel module with a fallback that never crashes: the policy, reusable.

    from minidist.kernels.fallback import CompiledBackend
    fused = CompiledBackend("numba-cpu", "my_package.my_kernels",
                            fix="Install numba (`pip install numba`) for the fused kernels.")
    out = fused.call("my_op", my_reference_op, src, dst, 0.5)   # compiled, or the reference
    run = fused.bind("my_op", my_reference_op, src, dst, 0.5)   # the same choice, kept:
    out = run(src, dst, 0.5)                                    # a hot path calls it directly

A compiled backend can fail in three places, and on some machines each one does: *loading*
(Numba missing, no driver, a broken install), *compiling* (numba-cuda 0.30 under NumPy 2.5
raises AttributeError from its typing code), and the *first launch* (no binary for this GPU,
too many resources). The policy, for all three and for any exception type:

    first call of (op, signature)  --rehearse on private copies-->  ok: remembered, run for real
                                              |
                                              '--any exception-->  ONE RuntimeWarning (cause +
                                                                   fix), the reference from now on

The rehearsal runs the compiled op on small private copies of the arguments (the first few
elements, same dtypes, the same aliasing: ``src is dst`` stays in place), so compiling and the
first launch happen before any caller data is touched: a backend that fails never leaves an
output half written, and the reference then computes the whole call. A later exception, after
the rehearsal of its signature succeeded, is a bug and propagates.

A backend module provides ``check_usable()`` (raise if it cannot run here) and may provide
``signature(op, *args)`` (what selects a compiled specialization; default: dtypes and aliasing)
and ``rehearse(op, *args)`` (default: ``op`` on ``private_copies(args)``), and
``compile_guard(op, *args)``, the context manager the rehearsal runs in (``kernels/jit_cache.py``:
one process of the machine compiles at a time, the time is counted).
``MINIDIST_KERNELS=reference`` chooses the reference for every backend on purpose (no warning).
"""

from __future__ import annotations

import contextlib
import enum
import importlib
import threading
import warnings
from types import ModuleType
from typing import Any, Callable, Hashable

import numpy as np

from minidist import xp as backend
from minidist.envvars import env
from minidist.logger import get_logger, rank_prefix

log = get_logger(__name__)

__all__ = ["CompiledBackend", "LoadState", "private_copies", "default_signature", "REFERENCE",
           "REHEARSAL_NUMEL"]

REFERENCE = "reference"
REHEARSAL_NUMEL = 67
"""Elements per array in a rehearsal: odd, above one warp, so a grid-stride tail runs too."""


_WARNED: set[tuple[str, str]] = set()
"""(toolchain, cause) pairs already warned about in this process: one failing Numba breaks
every backend built with it (the AMP kernels, the fused optimizer, ...), and says so once."""


class LoadState(enum.Enum):
    NOT_TRIED = "not tried"
    READY = "ready"
    UNAVAILABLE = "unavailable"


def _is_array(a: Any) -> bool:
    return isinstance(a, np.ndarray) or backend.is_device_array(a)


def private_copies(args: tuple[Any, ...], numel: int = REHEARSAL_NUMEL) -> tuple[Any, ...]:
    """Small copies of the array arguments (lists/tuples of arrays too): the first ``numel``
    elements of each, flat, same dtype and device; an array passed twice stays one copy (in
    place stays in place). Numbers and other objects pass through as they are."""
    seen: dict[int, Any] = {}

    def copy(a: Any) -> Any:
        if isinstance(a, (list, tuple)):
            return type(a)(copy(x) for x in a)
        if not _is_array(a):
            return a
        if id(a) not in seen:
            flat = a.reshape(-1)
            seen[id(a)] = flat[:min(int(flat.size), numel)].copy()
        return seen[id(a)]

    return tuple(copy(a) for a in args)


def default_signature(op: str, args: tuple[Any, ...]) -> Hashable:
    """What selects a compiled specialization: the op, each argument's type and dtype, and
    which arguments are the same array (in place). Called on every kernel call: kept cheap."""
    key: list[Any] = [op]
    first: dict[int, int] = {}
    for a in args:
        dtype = getattr(a, "dtype", None)
        if dtype is not None:
            key.append((type(a), dtype.char, first.setdefault(id(a), len(first))))
        elif isinstance(a, (list, tuple)):
            key.append(tuple((type(x), getattr(x, "dtype", None)) for x in a))
        else:
            key.append(type(a))
    return tuple(key)


class CompiledBackend:
    """A compiled kernel module, imported on first use and rehearsed per signature; on any
    failure one ``RuntimeWarning`` (cause and ``fix``), then the reference for good.

    Args:
        name: what the warning and ``implementation()`` call it ("numba-cpu").
        module: the module to import (``check_usable()`` is called right after).
        fix: one sentence telling the user how to get the compiled kernels.
        toolchain: what compiles it (default: the first word of ``name``). Backends of one
            toolchain that fail for the same cause give one warning between them; the
            others log it.
    """

    def __init__(self, name: str, module: str, fix: str, toolchain: str | None = None) -> None:
        self.name, self.module_name, self.fix = name, module, fix
        self.toolchain = toolchain or name.split()[0]  # "numba-cpu optimizer" -> "numba-cpu"
        self.state = LoadState.NOT_TRIED
        self.module: ModuleType | None = None
        self.reason = ""
        self.rehearsed: set[Hashable] = set()
        self.calls = 0  # every call(), compiled or reference (benchmarks count launches)
        self._lock = threading.RLock()  # the comm thread and the main thread may both be first

    def get(self) -> ModuleType | None:
        """The module, or None when the reference is to be used (loading happens once)."""
        if self.state is LoadState.NOT_TRIED:
            with self._lock:
                if self.state is LoadState.NOT_TRIED:
                    self._load()
        return self.module

    def _load(self) -> None:
        choice = env("MINIDIST_KERNELS")  # a bad value: one line naming it (envvars.py)
        if choice == REFERENCE:
            self.state, self.reason = LoadState.UNAVAILABLE, "MINIDIST_KERNELS=reference"
            return
        try:
            module = importlib.import_module(self.module_name)
            module.check_usable()
        except Exception as exc:  # ImportError, no driver, simulator on, broken install, ...
            self.give_up(f"loading {self.module_name} failed: {type(exc).__name__}: {exc}")
            return
        self.module, self.state = module, LoadState.READY

    def call(self, op: str, reference: Callable[..., Any], *args: Any) -> Any:
        """``op(*args)`` from the compiled module, or ``reference(*args)`` once it failed.

        The first call of each signature rehearses on private copies first, so a failure
        (any exception) falls back before any argument was written.
        """
        self.calls += 1
        return self.bind(op, reference, *args)(*args)

    def bind(self, op: str, reference: Callable[..., Any], *args: Any) -> Callable[..., Any]:
        """The function ``call`` would run for ``args`` (rehearsed now if its signature is
        new): a hot path that calls one signature again and again keeps it and calls it
        directly, without the dispatch (such calls are not counted in ``calls``)."""
        module = self.get()
        if module is None:
            return reference
        signature = getattr(module, "signature", None)
        key = signature(op, *args) if signature is not None else default_signature(op, args)
        if key not in self.rehearsed:
            with self._lock:
                if self.module is None:  # another thread gave up meanwhile
                    return reference
                if key not in self.rehearsed:
                    try:
                        self._rehearse(module, op, args)
                    except Exception as exc:
                        self.give_up(f"compiling or first launching {op} failed: "
                                     f"{type(exc).__name__}: {exc}")
                        return reference
                    self.rehearsed.add(key)
        return getattr(module, op)

    @staticmethod
    def _rehearse(module: ModuleType, op: str, args: tuple[Any, ...]) -> None:
        rehearse = getattr(module, "rehearse", None)
        guard = getattr(module, "compile_guard", None)
        with guard(op, *args) if guard is not None else contextlib.nullcontext():
            # e.g. one process of the machine compiling at a time (jit_cache.py)
            if rehearse is not None:
                rehearse(op, *args)
            else:
                getattr(module, op)(*private_copies(args))

    def give_up(self, reason: str) -> None:
        """Use the reference from now on, and say so once."""
        first = self.state is not LoadState.UNAVAILABLE
        self.state, self.module, self.reason = LoadState.UNAVAILABLE, None, reason
        if not first:
            return
        msg = (f"{rank_prefix()} minidist.kernels: the {self.name} kernels cannot run here "
               f"({reason}); using the {REFERENCE} implementation instead (same results, "
               f"slower). {self.fix}")
        cause = (self.toolchain, reason.rsplit("failed: ", 1)[-1])
        if cause in _WARNED:  # the same broken toolchain, already warned about
            log.info("%s", msg)
            return
        _WARNED.add(cause)
        try:
            warnings.warn(msg, RuntimeWarning, stacklevel=4)
        except Warning:  # warnings turned into errors: the fallback must still not crash
            log.warning("%s", msg)

    def reset(self) -> None:
        """Forget the outcome (tests; after installing Numba in a running process)."""
        with self._lock:
            self.state, self.module, self.reason = LoadState.NOT_TRIED, None, ""
            self.rehearsed = set()
