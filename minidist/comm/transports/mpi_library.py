"""The MPI library beneath the MPI transport: loading it, and asking what it can do.

    MPI = load_mpi()                      # mpi4py.MPI, or a CommError saying what to install
    parse_cuda_aware_env("auto")          # MINIDIST_CUDA_AWARE_MPI -> True / False / None
    mpi_cuda_aware()                      # does the loaded MPI take CUDA device pointers?
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

from minidist.comm.errors import CommError
from minidist.envvars import env


def load_mpi() -> Any:
    """Import ``mpi4py.MPI`` (initializing MPI) or raise a CommError that says what to install."""
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise CommError(f"backend='mpi' needs mpi4py, which is not importable ({e}). Install it "
                        "with `pip install mpi4py mpich`, or use backend='tcp' or 'local'.") from e
    except RuntimeError as e:  # mpi4py: "cannot load MPI library"
        raise CommError(f"mpi4py is installed but found no MPI library ({e}). Install one "
                        "(`pip install mpich`, or your system's MPI and set MPI4PY_LIBMPI), or use "
                        "backend='tcp' or 'local'.") from e
    return MPI


def parse_cuda_aware_env(value: str | None) -> bool | None:
    """Parse ``MINIDIST_CUDA_AWARE_MPI``: ``1``/``true`` -> True, ``0``/``false`` -> False,
    unset/``auto`` -> None (probe).

    Raises:
        ValueError: for any other value, naming the variable and the accepted values.
    """
    value_: bool | None = env("MINIDIST_CUDA_AWARE_MPI", {"MINIDIST_CUDA_AWARE_MPI": value or ""})
    return value_


def mpi_cuda_aware() -> bool | None:
    """Ask the loaded MPI library whether it can take CUDA device pointers (after MPI init).

    Returns True/False when the library answers (MPI 4.1 ``mpi_memory_alloc_kinds`` info key, or
    Open MPI's / MPICH's ``MPIX_Query_cuda_support``), None when it cannot tell. The PyPI MPI
    wheels answer False. See docs/env_vars.md (MINIDIST_CUDA_AWARE_MPI).
    """
    MPI = load_mpi()
    try:
        info = MPI.COMM_WORLD.Get_info()
        kinds = info.get("mpi_memory_alloc_kinds")
        info.Free()
        if kinds and "cuda:device" in kinds.split(","):
            return True
    except Exception:  # noqa: BLE001 - older MPIs have no such key; fall through to MPIX
        pass
    # mpi4py dlopens libmpi RTLD_LOCAL, so CDLL(None) cannot see it: reopen by name, no load.
    for so in ("libmpi.so.40", "libmpi.so.12", "libmpi_abi.so.1", "libmpi.so"):
        try:
            lib = ctypes.CDLL(so, mode=os.RTLD_NOLOAD | os.RTLD_GLOBAL)
        except OSError:
            continue
        f = getattr(lib, "MPIX_Query_cuda_support", None)
        if f is not None:
            f.restype = ctypes.c_int
            return bool(f())
    return None


__all__ = ["load_mpi", "mpi_cuda_aware", "parse_cuda_aware_env"]
