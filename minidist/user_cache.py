"""Where minidist keeps what it learns about this machine: one folder per user.

    from minidist.user_cache import user_cache_dir
    user_cache_dir()            # ~/.cache/minidist, or $XDG_CACHE_HOME/minidist
    user_cache_dir("kernels")   # ... /kernels: compiled fused kernels (kernels/jit_cache.py)

``MINIDIST_CACHE_DIR`` moves the whole folder (tests point it at a temporary one). It holds the
all-reduce calibrations of ``python -m minidist.tune`` (``allreduce-<host>-<transport>-n<N>.json``)
and the compiled fused kernels (``kernels/``). Deleting it is always safe: the tuning falls
back to the shipped defaults and the kernels compile again on first use.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["user_cache_dir"]


def user_cache_dir(*parts: str) -> Path:
    """``$MINIDIST_CACHE_DIR``, else ``$XDG_CACHE_HOME/minidist``, else ``~/.cache/minidist``;
    ``parts`` name a subfolder. Nothing is created here."""
    chosen = os.environ.get("MINIDIST_CACHE_DIR", "").strip()
    if chosen:
        root = Path(chosen).expanduser()
    else:
        xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
        root = (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "minidist"
    return root.joinpath(*parts)
