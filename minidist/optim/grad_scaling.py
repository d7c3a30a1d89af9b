"""Where gradient scaling meets the spine: two small registries the amp wing fills.

    add_scale_listener(ddp_reducer._use_scaler)   # DDP hears each GradScaler.scale() ...
    notify_scale(scaler)                           # ... which the amp wing calls
    set_master_owner(param, master_weights)        # amp.MasterWeights registers its params
    master_owner(param)                            # DDP finds the float32 masters

Mixed precision is a wing (minidist/amp): a step without it runs none of this, and the spine
never imports it. DDP only listens: a GradScaler's ``scale()`` tells the listeners of its
thread, and DDP plugs the scaler's fused unscale into each bucket's reduction for that step.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable

from minidist.tensor.weak import WeakIdKeyDictionary

_thread = threading.local()
_OWNER = WeakIdKeyDictionary()  # parameter -> the object holding its float32 master


def add_scale_listener(listener: Callable[[Any], None]) -> None:
    """Call ``listener(scaler)`` whenever a GradScaler's ``scale()`` runs on this thread.

    The listener is held weakly (a bound method: as long as its object lives).
    """
    ref = weakref.WeakMethod(listener) if hasattr(listener, "__self__") else \
        weakref.ref(listener)
    listeners = getattr(_thread, "listeners", None)
    if listeners is None:
        listeners = _thread.listeners = []
    listeners.append(ref)


def remove_scale_listener(listener: Callable[[Any], None]) -> None:
    """Stop calling ``listener`` (a no-op if it is not registered on this thread)."""
    listeners = getattr(_thread, "listeners", [])
    listeners[:] = [r for r in listeners if r() is not None and r() != listener]


def notify_scale(scaler: Any) -> None:
    """Tell this thread's listeners that ``scaler.scale()`` ran."""
    listeners = getattr(_thread, "listeners", None)
    if listeners:
        for ref in list(listeners):
            fn = ref()
            if fn is None:
                listeners.remove(ref)
            else:
                fn(scaler)


def set_master_owner(param: Any, owner: Any) -> None:
    """Record that ``owner`` (an amp.MasterWeights) holds ``param``'s float32 master."""
    _OWNER[param] = owner


def master_owner(param: Any) -> Any:
    """The object holding ``param``'s float32 master, or None for a plain parameter."""
    try:
        return _OWNER.get(param)
    except TypeError:  # not weak-referenceable: certainly not converted
        return None


__all__ = ["add_scale_listener", "remove_scale_listener", "notify_scale", "set_master_owner",
           "master_owner"]
