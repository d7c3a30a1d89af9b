"""Shared benchmark helpers: size sweeps, statistics, fixed-width tables, machine info, JSON.

    from _common import sizes, stats, Table, machine_info, write_json
    for nbytes in sizes(8, 64 << 20, step=2): ...
    t = Table([("size(B)", 10, "d"), ("time(us)", 10, ".1f")]); print(t.header()); print(t.row(...))

Used by benchmarks/allreduce.py (and any later benchmark); no minidist imports here.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, NoReturn, Sequence

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
    """Median / min / max / mean / quartiles of samples in seconds, returned in microseconds;
    ``spread`` is the interquartile range over the median (0.1: the middle half of the samples
    lies within 10 % of the median's size)."""
    us = [s * 1e6 for s in samples_s]
    q1, med, q3 = (statistics.quantiles(us, n=4, method="inclusive") if len(us) > 1
                   else (us[0], us[0], us[0]))
    return {"median_us": statistics.median(us), "min_us": min(us), "max_us": max(us),
            "mean_us": statistics.fmean(us), "q1_us": q1, "q3_us": q3,
            "spread": (q3 - q1) / med if med > 0 else 0.0, "samples": len(us)}


# ---------------------------------------------------------------- launch, flags, Ctrl-C

_RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "RANK", "SLURM_PROCID")


def launch_rank() -> int:
    """This process's rank as its launcher set it (mpiexec, torchrun-style env, SLURM), read
    before any process group exists; 0 when launched alone."""
    for var in _RANK_VARS:
        value = os.environ.get(var, "")
        if value.isdigit():
            return int(value)
    return 0


def usage_error(message: str) -> NoReturn:
    """End a benchmark over a bad flag: ONE line (on the launch's rank 0 only, so a job of N
    ranks does not print it N times), exit code 2 as argparse uses, no traceback."""
    if launch_rank() == 0:
        print(f"{Path(sys.argv[0]).name}: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


class Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line from rank 0 (``usage_error``) instead of the usage
    block once per rank."""

    def error(self, message: str) -> NoReturn:
        usage_error(f"{message} (see --help)")


class StopRequest:
    """Ctrl-C as a request to stop and keep what was measured.

    Installed before ``init_process_group`` (minidist then leaves SIGINT to the script) and
    armed when the measuring starts: from then on the first SIGINT only sets ``requested``;
    the ranks ask ``agreed(group)`` at points of the sweep they all reach, so they stop
    together, at the same place, and rank 0 can write what it has. Before ``arm()``, and on a
    second Ctrl-C, SIGINT raises KeyboardInterrupt, which ends the job at once (minidist's one
    line, exit 130) without saving.
    """

    exit_code = 128 + signal.SIGINT  # 130, as a shell reports a Ctrl-C'd command

    def __init__(self) -> None:
        self.requested = self.armed = False
        self.previous = signal.signal(signal.SIGINT, self._on_sigint)

    def arm(self) -> None:
        self.armed = True

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if self.requested or not self.armed:
            raise KeyboardInterrupt
        self.requested = True

    def agreed(self, group: Any) -> bool:
        """True on every rank when any rank was asked to stop (a collective: every rank calls
        it at the same points)."""
        import numpy

        if group.size == 1:
            return self.requested
        flag = numpy.array([1 if self.requested else 0], numpy.int64)
        return bool(group.all_gather(flag).max())

    def restore(self) -> None:
        signal.signal(signal.SIGINT, self.previous)


class Stopped(Exception):
    """Raised inside a sweep when the ranks agreed to stop (``StopRequest``)."""


# ---------------------------------------------------------------- a busy machine

BUSY_LOAD_PER_CORE = 0.5  # other processes' load per core above which timings are not quiet


def load_average() -> float | None:
    """The 1-minute load average (None where the OS has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def busy_note(load: float | None, cores: int | None = None) -> str | None:
    """One sentence when the machine was busy before the benchmark started (its ranks are not
    in a load average taken at their start), else None."""
    cores = cores or os.cpu_count() or 1
    if load is None or load <= BUSY_LOAD_PER_CORE * cores:
        return None
    return (f"load average {load:.1f} on {cores} cores before the run: other processes compete "
            f"for the cores, so times are slower and noisier than on a quiet machine")


class Eta:
    """Time left in a size sweep, from the sizes measured so far.

    The wall time of one call at ``nbytes`` is modelled as ``a + b * nbytes``. ``a`` (latency,
    barrier, Python) is read off the last three sizes done, so it follows the load of the
    moment (on a machine shared with other jobs it can grow tenfold within a run). ``b``
    (seconds per byte) is
    ``prior_s_per_byte``, which the caller measures at ``prior_bytes`` on this machine under its
    present load before the sweep (benchmarks/allreduce.py: one call of every algorithm at the
    largest size), until the sweep itself reaches a quarter of that size; from then on, the
    largest size done gives it (the load may have changed since). The largest sizes take most
    of a sweep's time and run beyond the caches, where a byte costs more than in them, so ``b``
    comes from sizes like them. Extrapolating the bytes moved by the small sizes instead (all
    latency, nearly no bytes) predicted days for a sweep of minutes.
    """

    def __init__(self, prior_s_per_byte: float, prior_bytes: int) -> None:
        self.prior, self.prior_bytes = prior_s_per_byte, prior_bytes
        self.points: list[tuple[int, float]] = []  # (nbytes, seconds per call)

    def done(self, nbytes: int, calls: int, seconds: float) -> None:
        self.points.append((nbytes, seconds / max(calls, 1)))

    def model(self) -> tuple[float, float]:
        """(a seconds, b seconds per byte) fitted to the sizes done."""
        if not self.points:
            return 0.0, self.prior
        first = statistics.median(w for _, w in self.points[:3])
        s_big, w_big = max(self.points)
        b = self.prior
        if 4 * s_big >= self.prior_bytes and w_big > first:
            b = (w_big - first) / s_big
        a = statistics.median(max(0.0, w - b * s) for s, w in self.points[-3:])
        return a, b

    def left(self, todo: Sequence[tuple[int, int]]) -> float:
        """Seconds for the ``(nbytes, calls)`` still to run."""
        a, b = self.model()
        return sum(calls * (a + b * nbytes) for nbytes, calls in todo)


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


def use_library(folder: str) -> None:
    """Import minidist from ``folder`` (an unpacked older commit) instead of this checkout:
    drop the editable install's finder, which would otherwise answer first."""
    sys.meta_path[:] = [f for f in sys.meta_path  # (a finder class or instance: its module)
                        if not getattr(f, "__module__", "").startswith("__editable__")]
    sys.path.insert(0, folder)


def export_commit(rev: str, into: Path, tool: str) -> str:
    """``rev``'s minidist package, unpacked into ``into`` (for ``use_library``); returns the full
    commit id. A bad ``rev`` ends ``tool`` with one line."""
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", f"{rev}^{{commit}}"],
                            capture_output=True, text=True)
    if commit.returncode != 0:
        sys.exit(f"{tool}: --old {rev!r} is not a commit of this repository "
                 f"({commit.stderr.strip()}). Pass a commit id, tag or branch, e.g. HEAD~10.")
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit.stdout.strip(),
                              "minidist"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return commit.stdout.strip()


def alternate(tool: str, rev: str, rounds: int, out_dir: Path,
              run_side: Callable[[Path | None, Path], dict[str, Any]],
              extra: dict[str, Any] | None = None) -> tuple[str, list[dict[str, Any]]]:
    """``rounds`` rounds of an A/B benchmark (``ddp_overhead_ab.py``, ``allreduce_ab.py``):
    the old commit ``rev`` (exported to a temporary folder) and this checkout, one job each,
    the order flipping every round. ``run_side(library or None for this checkout, a temporary
    JSON path)`` runs one job. Returns the full commit id and the rounds, each ``{"round",
    "first", "old", "new", **extra}``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    done = []
    with tempfile.TemporaryDirectory(prefix=f"{tool}_") as tmp:
        old = export_commit(rev, Path(tmp), tool)
        for k in range(rounds):
            order = ("old", "new") if k % 2 == 0 else ("new", "old")
            row: dict[str, Any] = {"round": k + 1, "first": order[0], **(extra or {})}
            for side in order:
                print(f"# round {k + 1}: {side}", flush=True)
                row[side] = run_side(Path(tmp) if side == "old" else None,
                                     out_dir / f".{tool}.tmp.json")
            done.append(row)
    return old, done


def run_ab_job(tool: str, script: str, n: int, job_args: list[str], library: Path | None,
               out: Path, timeout: float) -> dict[str, Any]:
    """One side of an A/B benchmark: ``mpiexec -n n python script --job-out out *job_args``
    (``--library`` for the old side), one BLAS thread per rank; returns the JSON its rank 0
    wrote to ``out`` (then removed). A failed job ends the benchmark, naming the side."""
    cmd = [mpiexec_path(), "-n", str(n), sys.executable, script, "--job-out", str(out),
           *job_args]
    cmd += ["--library", str(library)] if library else []
    done = subprocess.run(cmd, env=one_thread_env(), timeout=timeout)
    if done.returncode != 0:
        sys.exit(f"{tool}: the {'old' if library else 'new'} side's job failed "
                 f"(exit {done.returncode}; its output is above).")
    res = json.loads(out.read_text())
    out.unlink()
    return res


def write_ab(tool: str, out_dir: Path, old: str, rounds: list[dict[str, Any]], text: str) -> None:
    """Print an A/B benchmark's table; write ``<tool>.json`` (the rounds) and ``<tool>.txt``."""
    print(text)
    meta = {"command": " ".join([f"python benchmarks/{tool}.py", *sys.argv[1:]]),
            "machine": f"{platform.machine()} {os.cpu_count()} cpus, {platform.python_version()}",
            "old": old, "rounds": rounds}
    (out_dir / f"{tool}.json").write_text(json.dumps(meta, indent=2))
    (out_dir / f"{tool}.txt").write_text(f"# {meta['command']}  ({meta['machine']})\n"
                                         + text + "\n")
    print(f"# wrote {shown(out_dir / f'{tool}.json')} and {tool}.txt")


def ab_entry(p: argparse.ArgumentParser, args: argparse.Namespace,
             job: Callable[[], dict[str, Any] | None],
             driver: Callable[[argparse.Namespace], None]) -> None:
    """An A/B script's entry point: inside a job (``--job-out``, under mpiexec) run ``job()``
    with the old library when ``--library`` names one, rank 0 writing its result; otherwise
    the driver, which needs ``--old``."""
    if args.job_out:
        if args.library:
            use_library(args.library)
        res = job()
        if res is not None:
            Path(args.job_out).write_text(json.dumps(res))
    elif not args.old:
        p.error("--old is required: the commit to compare this checkout with (e.g. HEAD~10)")
    else:
        driver(args)
