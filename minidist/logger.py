"""Rank-prefixed logging for every layer: ``[rank r/N] message`` on the "minidist" logger.

    from minidist.logger import get_logger
    log = get_logger(__name__)          # a child of the "minidist" logger
    log.info("bucket plan: %d buckets", n)

The rank prefix is filled in by ``init_process_group`` (``set_rank``); before that (or in a
process that builds its transport itself) it comes from the launcher's variables (``RANK`` /
``WORLD_SIZE``, ``PMI_RANK`` / ``PMI_SIZE``, ``OMPI_COMM_WORLD_*``), else ``[rank 0/1]``. Level comes from
``MINIDIST_LOG_LEVEL`` (default WARNING) or ``MINIDIST_DEBUG=1`` (DEBUG). Progress output meant
for people goes through ``is_main_process()`` checks in the callers: only rank 0 prints it.
"""

from __future__ import annotations

import logging
import os
import sys

from minidist.envvars import env

_rank: int | None = None  # None: not set yet, read the launcher's variables
_world_size = 1
_configured = False
_LAUNCHER_VARS = (("RANK", "WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE"),
                  ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"))


def set_rank(rank: int, world_size: int) -> None:
    """Record this process's rank so every log line carries ``[rank r/N]``."""
    global _rank, _world_size
    _rank, _world_size = int(rank), int(world_size)


def rank_prefix() -> str:
    """``[rank r/N]``: the prefix every error message and log line starts with."""
    if _rank is None:
        for rank_var, size_var in _LAUNCHER_VARS:
            rank, size = os.environ.get(rank_var, ""), os.environ.get(size_var, "")
            if rank.isdigit() and size.isdigit():
                return f"[rank {rank}/{size}]"
        return "[rank 0/1]"
    return f"[rank {_rank}/{_world_size}]"


def debug_level() -> int:
    """``MINIDIST_DEBUG`` as an int: 0 off, 1 each collective's algorithm, 2 every message."""
    return int(env("MINIDIST_DEBUG"))


class _RankFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.rank_prefix = rank_prefix()
        return True


def _configure() -> None:
    global _configured
    if _configured:
        return
    _configured = True
    root = logging.getLogger("minidist")
    if debug_level() > 0:
        level = "DEBUG"
    else:
        level = env("MINIDIST_LOG_LEVEL")
    root.setLevel(getattr(logging, level, logging.WARNING))
    if not root.handlers:
        handler = logging.StreamHandler()
        handler.addFilter(_RankFilter())
        handler.setFormatter(logging.Formatter("%(rank_prefix)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
        root.propagate = False


def human_bytes(n: int) -> str:
    """``741455`` -> ``'724 KiB'``: sizes in messages, reasons and tables."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            v = n / (1 << shift)
            return f"{v:.0f} {unit}" if v >= 10 or v == int(v) else f"{v:.1f} {unit}"
    return f"{n} B"


def get_logger(name: str = "minidist") -> logging.Logger:
    """A logger under "minidist" whose lines are prefixed with this process's rank."""
    _configure()
    if not name.startswith("minidist"):
        name = "minidist." + name
    return logging.getLogger(name)


# This module was minidist/log.py; ``minidist.log`` is now torch's function, and the old
# import path (``from minidist.log import ...``) still finds this module.
sys.modules.setdefault("minidist.log", sys.modules[__name__])
