"""How the TCP wing attaches to the spine: the "tcp" backend of ``init_process_group``.

    make_transport("tcp", info, timeout_s)   # comm/backends.py looks "tcp" up in TRANSPORTS
    rendezvous_port(info)                    # MASTER_PORT, or beside torchrun's agent
"""

from __future__ import annotations

import errno
import os
from typing import Any

from minidist import logger as mdlog
from minidist.comm import backends
from minidist.comm.env import LaunchInfo
from minidist.comm.errors import CommError
from minidist.envvars import env as env_var
from minidist.tcp.transport import TCPTransport

log = mdlog.get_logger("minidist.comm.api")  # its lines keep the name users know


def make_tcp_transport(info: LaunchInfo, timeout_s: float) -> TCPTransport:
    """The TCP transport of ``info``'s rank, met at the rendezvous (``rendezvous_port``)."""
    if info.world_size is None or info.master_port is None:
        raise ValueError("init_process_group(backend='tcp'): needs RANK, WORLD_SIZE, MASTER_ADDR "
                         "and MASTER_PORT in the environment (as torchrun and python -m "
                         "minidist.launch set them), or rank=, world_size= and "
                         "init_method='tcp://host:port'; "
                         f"detected launcher={info.launcher!r}, MASTER_PORT={info.master_port}.")
    port = rendezvous_port(info)
    try:
        return TCPTransport(info.rank, info.world_size, info.master_addr or "127.0.0.1", port,
                            timeout_s)
    except CommError as e:
        if port == info.master_port or getattr(e.__cause__, "errno", None) != errno.EADDRINUSE:
            raise
        why = ("MINIDIST_RENDEZVOUS_PORT" if env_var("MINIDIST_RENDEZVOUS_PORT") is not None
               else f"MASTER_PORT + 1, since torchrun's agent holds MASTER_PORT={info.master_port}")
        raise CommError(f"{mdlog.rank_prefix()} init_process_group: the TCP rendezvous needs port "
                        f"{port} ({why}), and another program is using it. Set "
                        "MINIDIST_RENDEZVOUS_PORT to a free port (the same on every rank), or "
                        "pick another MASTER_PORT.") from e


def rendezvous_port(info: LaunchInfo, env: Any = None) -> int:
    """The port of the TCP rendezvous: MASTER_PORT, or beside it under a real torchrun.

    torchrun's agent already serves its own store on MASTER_PORT (``TORCHELASTIC_RUN_ID`` is set
    in its ranks), so there minidist meets at MASTER_PORT + 1 on the same host instead;
    ``MINIDIST_RENDEZVOUS_PORT`` chooses the port explicitly (every rank must set the same).
    """
    env = os.environ if env is None else env
    explicit = env_var("MINIDIST_RENDEZVOUS_PORT", env)
    if explicit is not None:
        return int(explicit)
    if env.get("TORCHELASTIC_RUN_ID") and info.master_port is not None:
        port = info.master_port + 1
        if info.rank == 0:
            log.info("torchrun detected: its agent serves MASTER_PORT=%d, so the minidist "
                     "rendezvous uses port %d (set MINIDIST_RENDEZVOUS_PORT to choose another)",
                     info.master_port, port)
        return port
    if info.master_port is None:
        raise ValueError("init_process_group(backend='tcp'): MASTER_PORT is not set; set it to "
                         "the same free port on every rank (or pass init_method='tcp://host:port').")
    return int(info.master_port)


def attach() -> None:
    """Register the "tcp" backend (idempotent)."""
    backends.TRANSPORTS["tcp"] = make_tcp_transport


__all__ = ["make_tcp_transport", "rendezvous_port", "attach"]
