"""torch.serialization's allow-list: which classes ``load`` may unpickle with weights_only on.

    from minidist import serialization           # torch.serialization
    with serialization.safe_globals([Config, nn.modules.linear.Linear]):
        ckpt = minidist.load("run.pt")            # weights_only defaults on, as in torch 2.6+
    serialization.add_safe_globals([Config])      # for the rest of the process

A file written by ``save`` holds data (a state dict: loads whatever ``weights_only`` says) or,
when it holds an object that is not data (a whole Module, a dataclass config), a pickle. A
pickle names the classes and functions it rebuilds, and unpickling calls them, so with
``weights_only`` on (the default) only these load: minidist's Tensor and Parameter, NumPy
arrays and dtypes, ``collections.OrderedDict``, Python's plain containers, and what the caller
allow-lists here. Anything else raises ``pickle.UnpicklingError`` naming the global and both
fixes, as torch's does. ``weights_only=False`` unpickles everything (trusted files only).
"""

from __future__ import annotations

import collections
import contextlib
import threading
from typing import Any, Iterable, Iterator

import numpy as np

_lock = threading.Lock()
_user: list[Any] = []  # what add_safe_globals and the safe_globals contexts allow


def _builtin_allowed() -> set[Any]:
    """The globals every weights_only load accepts (data only: nothing that runs user code)."""
    from minidist.nn import Parameter
    from minidist.tensor import Tensor
    allowed: set[Any] = {Tensor, Parameter, collections.OrderedDict, np.ndarray, np.dtype,
                         set, frozenset, slice, complex, bytearray}
    allowed.update(type(np.dtype(t)) for t in np.sctypeDict.values())  # the dtype classes
    allowed.update(set(np.sctypeDict.values()))                          # the scalar types
    return allowed


# (module, name) pairs NumPy's own pickles name, which move between NumPy versions
_NUMPY_GLOBALS = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray",
                  "_reconstruct"), ("numpy.core.multiarray", "scalar"),
                  ("numpy._core.multiarray", "scalar"), ("numpy.core.numeric", "_frombuffer"),
                  ("numpy._core.numeric", "_frombuffer"), ("_codecs", "encode")}


def add_safe_globals(safe_globals: Iterable[Any]) -> None:
    """torch's ``add_safe_globals``: allow these classes/functions in every later load."""
    with _lock:
        _user.extend(safe_globals)


def get_safe_globals() -> list[Any]:
    """What ``add_safe_globals`` and the open ``safe_globals`` contexts allow."""
    with _lock:
        return list(_user)


def clear_safe_globals() -> None:
    """Forget everything ``add_safe_globals`` allowed."""
    with _lock:
        _user.clear()


@contextlib.contextmanager
def safe_globals(safe_globals: Iterable[Any]) -> Iterator[None]:
    """torch's ``safe_globals`` context manager: allow these inside the ``with`` block only."""
    added = list(safe_globals)
    with _lock:
        _user.extend(added)
    try:
        yield
    finally:
        with _lock:
            for g in added:
                _user.remove(g)


def is_allowed(module: str, name: str, obj: Any) -> bool:
    """Whether a weights_only load may rebuild ``obj`` (found as ``module.name``)."""
    if (module, name) in _NUMPY_GLOBALS:
        return True
    allowed = get_safe_globals()
    return any(obj is g for g in allowed) or obj in _builtin_allowed()


__all__ = ["add_safe_globals", "clear_safe_globals", "get_safe_globals", "is_allowed",
           "safe_globals"]
