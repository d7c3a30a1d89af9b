"""Shared benchmark helpers: size sweeps, statistics, fixed-width tables, machine info, JSON.

    from _common import sizes, stats, Table, machine_info, write_json
    for nbytes in sizes(8, 64 << 20, step=2): ...
    t = Table([("size(B)", 10, "d"), ("time(us)", 10, ".1f")]); print(t.header()); print(t.row(...))

Used by benchmarks/allreduce.py (and any later benchmark); no minidist imports here.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# The published results (quoted in docs/): regenerate them with ``--out benchmarks/results``.
RESULTS = REPO / "benchmarks" / "results"
# Where a benchmark writes by default: your own runs, kept apart (``runs/`` is git-ignored).
LOCAL_RESULTS = REPO / "runs" / "bench"


def shown(path: str | os.PathLike) -> str:
    """``path`` relative to the repository when inside it (no machine paths in the output)."""
    resolved = Path(path).resolve()
    try:
        return str(resolved.relative_to(REPO))
    except ValueError:
        return str(path)


def mpiexec_path() -> str:
    """The ``mpiexec`` beside this Python (the venv's, from the mpich wheel), else the one on
    PATH; without either, exit with a line that says how to get one."""
    here = Path(sys.executable).parent / "mpiexec"
    found = str(here) if here.exists() else shutil.which("mpiexec")
    if found is None:
        raise SystemExit(f"{Path(sys.argv[0]).name}: no mpiexec; install the mpich wheel "
                         "(.venv/bin/pip install mpich) or run ./test.sh once")
    return found


def one_thread_env() -> dict[str, str]:
    """This environment with one BLAS/OpenMP thread per process: ranks that share the
    machine's cores must not each start a thread per core."""
    return dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")


def parse_bytes(text: str) -> int:
    """``"64M"`` / ``"4k"`` / ``"1GiB"`` / ``"123"`` -> bytes (powers of 1024)."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    try:
        return int(float(t[:-1] if mult > 1 else t) * mult)
    except ValueError:
        raise ValueError(f"cannot read {text!r} as a size; use e.g. 8, 4K, 64M") from None


def sizes(min_bytes: int, max_bytes: int, step: int = 2) -> list[int]:
    """Geometric sweep min..max (inclusive) by factor ``step``."""
    out, s = [], max(1, min_bytes)
    while s <= max_bytes:
        out.append(s)
        s *= step
    return out


def human(nbytes: int) -> str:
    """8 -> '8 B', 1048576 -> '1 MiB'."""
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << k and nbytes % (1 << k) == 0:
            return f"{nbytes >> k} {unit}"
    return f"{nbytes} B"


def stats(samples_s: list[float]) -> dict:
    """Median / min / max / mean of samples in seconds, returned in microseconds."""
    us = [s * 1e6 for s in samples_s]
    return {"median_us": statistics.median(us), "min_us": min(us), "max_us": max(us),
            "mean_us": statistics.fmean(us), "samples": len(us)}


class Table:
    """A fixed-width text table: columns are (title, width, format spec)."""

    def __init__(self, columns: list[tuple[str, int, str]]) -> None:
        self.columns = columns

    def header(self) -> str:
        return "# " + " ".join(f"{t:>{w}}" for t, w, _ in self.columns)

    def row(self, *values: Any) -> str:
        cells = []
        for (_, w, fmt), v in zip(self.columns, values):
            if v is None or (isinstance(v, float) and v != v):
                cells.append(f"{'-':>{w}}")
            else:
                cells.append(f"{v:>{w}{fmt}}")
        return "  " + " ".join(cells)


def cpu_model() -> str:
    """The ``lscpu`` model name (or platform.processor())."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return platform.processor() or "unknown"


def machine_info(extra: dict | None = None) -> dict:
    """Host, CPU, core count, Python/NumPy versions, time: what a result JSON needs to be read."""
    import numpy

    info = {"host": socket.gethostname(), "cpu_model": cpu_model(), "cores": os.cpu_count(),
            "python": sys.version.split()[0], "numpy": numpy.__version__,
            "platform": platform.platform(),
            "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    info.update(extra or {})
    return info


def write_json(path: Path, data: dict) -> Path:
    """Write ``data`` as indented JSON through a temp file + rename (never a half file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    os.replace(tmp, path)
    return path
