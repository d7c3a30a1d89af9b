"""torch.distributed's queries about the process group that minidist answers from its own.

    import minidist as dist
    dist.init_process_group()
    dist.get_backend()          # "mpi" under mpiexec, "gloo" for the TCP transport

``get_backend`` names the transport that runs in torch's vocabulary: minidist's TCP transport
is what ``backend="gloo"`` asks for, so it answers ``"gloo"``; MPI is ``"mpi"`` (torch's name
too). There is no NCCL: a script that asked for ``"nccl"`` gets the name of the transport its
launcher implied (see docs/porting.md). The one-process and thread transports answer
``"local"`` and ``"threads"``, which torch has no name for.
"""

from __future__ import annotations

from typing import Any

from minidist import comm

# minidist transport -> the torch backend name it stands for
TORCH_NAMES = {"tcp": "gloo", "mpi": "mpi"}


def get_backend(group: Any = None) -> str:
    """The backend of ``group`` (default: the default group), as torch names it.

    Raises:
        ValueError: no process group (torch's error, with what to call).
    """
    if group is None:
        if not comm.is_initialized():
            raise ValueError("get_backend: the default process group has not been "
                             "initialized; call minidist.init_process_group() first.")
        group = comm.get_default_group()
    return TORCH_NAMES.get(group.backend, group.backend)


__all__ = ["get_backend", "TORCH_NAMES"]
