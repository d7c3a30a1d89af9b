"""ProcessGroup's methods over the fast-path wing's shared memory: communication buffers, and
MPI's call count on the node.

    buf = group.alloc_buffer(numel, np.float32)   # collective: DDP's buckets are made so
    group.free_buffer(buf)                        # collective for a shared window: freed now

``alloc_buffer`` places a communication buffer (DDP's buckets) in the fast-path wing's shared
memory when the group has it, else where the transport says; ``free_buffer`` releases such a
window early. ``mpi_calls_ahead`` is the fast-path wing's count of MPI's own collectives (the
shared guard lines), read by the watch wing's failure diagnosis. ``ProcessGroup`` (group.py)
binds each as its method.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from minidist import xp as backend
from minidist.comm.calls import call_spec

if TYPE_CHECKING:
    from minidist.comm.group import ProcessGroup


def mpi_calls_ahead(self: ProcessGroup, peer: int) -> int:
    """The MPI collective call number ``peer`` has posted beyond this rank's, else 0
    (ranks on one node, MPI transport: the shared guard lines; elsewhere always 0)."""
    shared = self.shared_memory
    return shared.native_ahead(peer) if shared is not None else 0


def alloc_buffer(self: ProcessGroup, numel: int, dtype: Any, xp: Any = None) -> Any:
    """A 1-D communication buffer placed where the transport moves data best.

    Collective: every rank calls it alike (DDP allocates its buckets at construction). Where
    the group has shared memory (the fast-path wing's), NumPy buffers go into a shared window
    (``free_buffer`` releases one early); otherwise the transport allocates.
    """
    xp = xp or backend.default_array_module()
    self.drain()
    if xp is np and self.shared_memory is not None:
        dt = np.dtype(dtype)
        spec = call_spec("alloc_buffer", "alloc_buffer", int(numel), dt, algorithm="shm")
        with self.observed(spec, 0, (int(numel),)):
            return self.shared_memory.alloc_buffer(numel, dtype)
    return self.transport.alloc_buffer(numel, dtype, xp)


def free_buffer(self: ProcessGroup, buf: Any) -> bool:
    """Release a buffer from ``alloc_buffer`` now instead of at exit (shared windows).

    Collective when ``buf`` lives in a shared-memory window: every rank calls it alike.
    Every array that views ``buf`` must be dropped first (its memory is unmapped).
    Returns True if a window was freed, False for an ordinary array (nothing to do).
    """
    shared = self.shared_memory
    return shared.free_buffer(buf) if shared is not None else False


__all__ = ["mpi_calls_ahead", "alloc_buffer", "free_buffer"]
