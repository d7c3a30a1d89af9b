"""Scratch buffers for the algorithms: allocated once per (transport, array module, dtype, tag,
slot) and reused, growing only when a larger message arrives.

    recv = scratch(transport, like=buf, numel=chunk)   # a view of a cached buffer, never zeroed

Why: allocating (and first touching) a fresh multi-MiB receive buffer on every call costs more
than the copy itself; MPI's own Allreduce pays this at large sizes. Keying by the tag's stream
(``stream_of(tag)``: the fingerprint bits of the tag change with every call) keeps two threads
that use different streams apart; one thread must never run two collectives on the same stream
at once on one transport.
"""

from __future__ import annotations

import weakref
from typing import Any

from minidist import xp as backend
from minidist.comm.transports.base import Transport, stream_of

_CACHE: "weakref.WeakKeyDictionary[Transport, dict]" = weakref.WeakKeyDictionary()


def scratch(transport: Transport, like: Any, numel: int, tag: int = 0, slot: int = 0) -> Any:
    """A 1-D buffer of ``numel`` elements of ``like``'s dtype and array module (not zeroed)."""
    xp = backend.get_array_module(like)
    key = (xp.__name__, like.dtype.str, stream_of(tag), slot)
    per_transport = _CACHE.setdefault(transport, {})
    buf = per_transport.get(key)
    if buf is None or buf.size < numel:
        buf = transport.alloc_buffer(max(int(numel), 1), like.dtype, xp)
        per_transport[key] = buf
    return buf[:numel]


def clear(transport: Transport) -> None:
    """Drop the cached buffers of one transport (process group teardown)."""
    _CACHE.pop(transport, None)
