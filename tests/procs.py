"""Start real multi-process jobs from pytest, bounded in time and always cleaned up.

    from procs import run_mpi
    result = run_mpi(4, ["-m", "some.module", "--flag"], timeout_s=60)   # python args
    assert result.returncode == 0, result.report()

Each job runs in its own process group (session); on timeout or any failure in the caller the
whole group gets SIGKILL, and so it does after a success (a straggler that outlived its
leader), so no rank outlives its test. One deadline bounds the whole job. A timeout raises AssertionError with
the tail of what every rank printed, so a hang names itself instead of stalling CI.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parent.parent


@dataclass
class JobResult:
    returncode: int
    stdout: str
    stderr: str
    argv: list

    def report(self, tail: int = 4000) -> str:
        return (f"command: {' '.join(map(str, self.argv))}\nexit: {self.returncode}\n"
                f"--- stdout (tail) ---\n{self.stdout[-tail:]}\n--- stderr (tail) ---\n{self.stderr[-tail:]}")


def in_a_git_checkout() -> bool:
    """True when the repository is a git checkout (the A/B benchmarks export an older commit)."""
    return subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"],
                          capture_output=True).returncode == 0


def mpiexec_path() -> str:
    """The mpiexec beside this interpreter (the venv's mpich wheel), else the one on PATH."""
    here = Path(sys.executable).parent / "mpiexec"
    if here.exists():
        return str(here)
    found = shutil.which("mpiexec")
    if found is None:
        raise RuntimeError("no mpiexec: install the mpich wheel (pip install mpich) or use ./test.sh")
    return found


def job_env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        env[k] = "1"
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    # A parent launched under mpiexec (or torchrun/SLURM) must not leak its rank into the child.
    for k in list(env):
        if k.startswith(("PMI_", "PMIX_", "OMPI_", "HYDRA_", "MPIR_", "SLURM_")) or k in (
                "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            del env[k]
    env.update(extra or {})
    return env


def _run_group(procs: list, argv: list, timeout_s: float) -> JobResult:
    """Wait for every process under ONE deadline for the whole job; kill each process group on
    every way out (a timeout, an exception in the caller, or success: stragglers that outlive
    their leader, such as a grandchild, are killed too)."""
    deadline = time.monotonic() + timeout_s
    outs, errs, codes = [], [], []
    try:
        for p in procs:
            out, err = p.communicate(timeout=max(0.0, deadline - time.monotonic()))
            outs.append(out), errs.append(err), codes.append(p.returncode)
    except subprocess.TimeoutExpired:
        _kill(procs)
        parts = []
        for i, p in enumerate(procs):
            out, err = _drain(p)
            leader = ("was still running" if p.returncode in (None, -signal.SIGKILL) else
                      f"had exited with {p.returncode}, but processes it started kept its "
                      f"output open")
            parts.append(f"[process {i}] {leader}\n{out[-1500:]}\n{err[-1500:]}")
        raise AssertionError(f"job timed out after {timeout_s}s and its process groups were "
                             f"killed: {' '.join(map(str, argv))}\n" + "\n".join(parts)) from None
    finally:
        _kill(procs)
    code = next((c for c in codes if c != 0), 0)
    return JobResult(code, "".join(outs), "".join(errs), argv)


def _drain(p: subprocess.Popen) -> tuple[str, str]:
    """What a killed process left in its pipes (bounded: a pipe some escaped process still
    holds open is given up after a few seconds)."""
    try:
        return p.communicate(timeout=5)
    except subprocess.TimeoutExpired:
        return "", "(its output pipes are held open by a process outside its group)"


def _table() -> dict[int, tuple[int, int, int]]:
    """pid -> (parent pid, process group, session) for every process, from /proc."""
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            out[int(name)] = (int(fields[1]), int(fields[2]), int(fields[3]))
    return out


def family(pid: int, leader_alive: bool = True) -> set[int]:
    """Every live process of the job led by ``pid``: its group and session (which outlive the
    leader), and the descendants of all of those (Hydra starts each rank in a session of its
    own under its proxy, so the group alone misses the ranks). ``leader_alive=False``: the
    leader was reaped, so ``pid`` itself may name a new, unrelated process: skip it."""
    table = _table()
    found = {q for q, (_, pgrp, sid) in table.items() if pgrp == pid or sid == pid}
    if leader_alive and pid in table:
        found.add(pid)
    todo = list(found)
    while todo:
        parent = todo.pop()
        for q, (ppid, _, _) in table.items():
            if ppid == parent and q not in found:
                found.add(q)
                todo.append(q)
    return found


def kill_group(pid: int, leader_alive: bool = True) -> None:
    """SIGKILL the job led by ``pid`` (started with ``start_new_session=True``), whether the
    leader is still alive or not: its process group, its session, and every descendant."""
    for q in family(pid, leader_alive) | {pid}:
        for kill in (os.killpg, os.kill):
            try:
                kill(q, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _kill(procs: list) -> None:
    for p in procs:
        kill_group(p.pid, leader_alive=p.poll() is None)
        if p.poll() is None:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass


def readline_within(stream, timeout_s: float) -> str:
    """One line from a child's pipe, or AssertionError after ``timeout_s`` (a plain
    ``readline()`` would wait for ever on a rank that hangs before printing)."""
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    if not box:
        raise AssertionError(f"no line within {timeout_s}s")
    return box[0]


def wait_job(p: subprocess.Popen, timeout_s: float) -> JobResult:
    """Wait for a job started with ``start_new_session=True`` and text pipes (bounded, and
    cleaned up like the jobs this module starts itself)."""
    return _run_group([p], list(p.args), timeout_s)


def run_mpi(n: int, python_args: list, timeout_s: float = 90, env: dict | None = None,
            cwd: str | Path | None = None, mpiexec_args: tuple = ()) -> JobResult:
    """Run `mpiexec [mpiexec_args] -n n python <python_args>`; return its result (never hangs
    past timeout_s)."""
    argv = [mpiexec_path(), *mpiexec_args, "-n", str(n), sys.executable, *map(str, python_args)]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=job_env(env), cwd=str(cwd or REPO), start_new_session=True)
    return _run_group([p], argv, timeout_s)


def run_python(python_args: list, timeout_s: float = 90, env: dict | None = None,
               cwd: str | Path | None = None) -> JobResult:
    """Run ``python <python_args>`` (a launcher, a script that spawns its ranks), bounded in
    time; on a timeout its whole process group is killed, children included."""
    argv = [sys.executable, *map(str, python_args)]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=job_env(env), cwd=str(cwd or REPO), start_new_session=True)
    return _run_group([p], argv, timeout_s)


def run_mpirun(args: list, timeout_s: float = 90, env: dict | None = None,
               cwd: str | Path | None = None) -> JobResult:
    """Run ``./mpirun.sh <args>`` as a user types it (e.g. ``["-n", "2", "python", script]``),
    bounded in time; on a timeout its whole process group is killed, ranks included."""
    argv = [str(REPO / "mpirun.sh"), *map(str, args)]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=job_env(env), cwd=str(cwd or REPO), start_new_session=True)
    return _run_group([p], argv, timeout_s)


def free_port() -> int:
    """A port free now, NOT reserved: another program may take it before the job binds it.
    Tests that start a job on a port use ``reserved_ports`` instead."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def reserved_ports(count: int = 1, host: str = "127.0.0.1") -> Iterator[int]:
    """Yield p, the first of ``count`` consecutive ports p, p + 1, ... kept reserved until the
    block ends (as ``python -m minidist.launch --standalone`` does; see its ``reserve_port``).

    Each port is held by a socket bound with ``SO_REUSEADDR`` that never listens: rank 0's
    rendezvous listener (which sets ``SO_REUSEADDR`` too) can still bind it, while ordinary
    binds and the kernel's choice of ephemeral ports skip it. So a test's port cannot be taken
    between the pick and the job's bind. Under torchrun the ranks meet at MASTER_PORT + 1:
    such a test reserves two.
    """
    for _ in range(100):
        held: list[socket.socket] = []
        try:
            for i in range(count):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                held.append(s)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind((host, held[0].getsockname()[1] + i if i else 0))
        except OSError:
            for s in held:
                s.close()
            continue
        try:
            yield held[0].getsockname()[1]
        finally:
            for s in held:
                s.close()
        return
    raise RuntimeError(f"reserved_ports: found no {count} consecutive free ports on {host}")


def run_env_ranks(n: int, python_args: list, timeout_s: float = 90, env: dict | None = None,
                  cwd: str | Path | None = None, port: int | None = None) -> JobResult:
    """Start n plain processes torchrun-style (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT),
    with a run id of their own (MINIDIST_RUN_ID, as a launcher gives; ``env`` may set it, or
    set it to "" for a job without identity)."""
    if port is None:  # reserve one for the job's whole life
        with reserved_ports() as port:
            return run_env_ranks(n, python_args, timeout_s, env, cwd, port)
    argv = [sys.executable, *map(str, python_args)]
    procs = []
    env = {"MINIDIST_RUN_ID": f"test-{os.getpid()}-{port}", **(env or {})}
    try:
        for r in range(n):
            e = job_env(env)
            e.update(RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(n),
                     MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True, env=e, cwd=str(cwd or REPO),
                                          start_new_session=True))
    except BaseException:
        _kill(procs)
        raise
    return _run_group(procs, argv, timeout_s)
