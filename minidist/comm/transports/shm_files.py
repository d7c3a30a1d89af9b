"""MPICH's shared-memory files of this job, removed before an abort leaves them behind.

    unlink_mapped()        # MPITransport.abort calls this just before MPI_Abort

MPICH keeps each node's shared memory in a file ``/dev/shm/mpich_shm_<id>_<n>`` (about 2 MB)
and removes it in ``MPI_Finalize``. A job that ends with ``MPI_Abort`` (an uncaught exception,
Ctrl-C, a rank leaving with a nonzero code) never finalizes, so every such run used to leave one
file per node. The files this process has mapped are listed in ``/proc/self/maps``: removing
their names is safe once the job is ending (the memory itself stays until the last rank has
gone). A rank killed from outside (SIGKILL, ``mpirun.sh``'s timeout) cannot do this;
``mpirun.sh`` removes what such a job left and says so.
"""

from __future__ import annotations

import os

PREFIX = "/dev/shm/mpich_shm_"


def mapped() -> list[str]:
    """The MPICH shared-memory files this process has mapped (empty off Linux)."""
    try:
        with open("/proc/self/maps") as f:
            return sorted({line.split()[-1] for line in f
                           if line.rstrip().split()[-1].startswith(PREFIX)})
    except OSError:
        return []


def unlink_mapped() -> list[str]:
    """Remove the names of this process's MPICH shared-memory files; return those removed."""
    removed = []
    for path in mapped():
        try:
            os.unlink(path)
            removed.append(path)
        except OSError:  # another rank of this node removed it first
            pass
    return removed
