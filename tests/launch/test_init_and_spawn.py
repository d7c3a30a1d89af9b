"""torch's ``init_process_group`` arguments, the torch backend names, and ``mp.spawn``."""

from __future__ import annotations

import logging
import re
import subprocess
import sys

import pytest

import minidist as md
from minidist.comm.env import LaunchInfo, apply_init_args, parse_init_method
from procs import REPO, free_port, job_env, run_env_ranks, run_mpi, wait_job

BODY = REPO / "tests" / "launch" / "spawn_rank.py"


def _run(args: list, timeout_s: float = 90) -> subprocess.CompletedProcess:
    p = subprocess.Popen([sys.executable, str(BODY), *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=str(REPO),
                         env=job_env({"MINIDIST_TIMEOUT_S": "30"}), start_new_session=True)
    result = wait_job(p, timeout_s)
    return subprocess.CompletedProcess(p.args, result.returncode, result.stdout, result.stderr)


@pytest.mark.parametrize("mode", ["ok", "explicit"])
def test_spawn_runs_a_tcp_group(mode):
    r = _run([mode])
    assert r.returncode == 0 and "SPAWN OK" in r.stdout, r.stdout + r.stderr


def test_spawn_raises_the_first_failure_with_rank_and_traceback():
    r = _run(["raise"])
    assert r.returncode == 7, r.stdout + r.stderr
    assert "RAISED index=1" in r.stdout, r.stdout
    assert "process 1 (rank 1) raised ValueError: rank one is broken" in r.stdout, r.stdout
    assert "worker_raise" in r.stdout, r.stdout  # the traceback names the function


@pytest.mark.mpi
@pytest.mark.parametrize("backend", ["auto", "gloo"])
def test_mpiexec_exports_rank_env_and_gloo_runs_tcp(backend, port):
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    r = run_mpi(2, [BODY, "mpi_env", backend], timeout_s=90, env=env)
    assert r.returncode == 0, r.report()
    want = "mpi" if backend == "auto" else "tcp"
    for rank in range(2):
        line = f"ENV rank={rank} backend={want} RANK={rank} LOCAL_RANK={rank} WORLD_SIZE=2"
        assert line in r.stdout, r.report()


@pytest.mark.parametrize("method,want", [
    ("tcp://127.0.0.1:29500", ("127.0.0.1", 29500)),
    ("tcp://[::1]:80", ("::1", 80)),
    ("env://", ("10.0.0.1", 1234)),
    (None, ("10.0.0.1", 1234)),
])
def test_parse_init_method(method, want):
    assert parse_init_method(method, {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234"}) == want


@pytest.mark.parametrize("method,message", [
    ("file:///tmp/x", "use 'env://'"), ("tcp://host", "expected 'tcp://host:port'"),
    ("tcp://h:70000", "not a TCP port"),
])
def test_parse_init_method_refuses(method, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_init_method(method, {})


def test_apply_init_args():
    single = LaunchInfo("single", 0, 1, 0)
    info = apply_init_args(single, "tcp://127.0.0.1:5", world_size=4, rank=2, env={})
    assert (info.launcher, info.rank, info.world_size, info.master_port) == ("explicit", 2, 4, 5)
    with pytest.raises(ValueError, match="pass both"):
        apply_init_args(single, None, world_size=4, env={})
    with pytest.raises(ValueError, match=re.escape("rank=4 must be in [0, 4)")):
        apply_init_args(single, None, world_size=4, rank=4, env={})
    mpi = LaunchInfo("hydra", 1, 2, 1)
    with pytest.raises(ValueError, match="the launcher \\(hydra\\) says rank=1, world_size=2"):
        apply_init_args(mpi, None, world_size=2, rank=0, env={})
    assert apply_init_args(mpi, None, world_size=2, rank=1, env={}).launcher == "hydra"
    # the message names the launcher that set the variables, not a torchrun that is absent
    ours = LaunchInfo("torchrun", 0, 2, 0, "127.0.0.1", 5, started_by="launch")
    with pytest.raises(ValueError, match=re.escape("launcher (python -m minidist.launch) says")):
        apply_init_args(ours, None, world_size=2, rank=1, env={})
    by_hand = LaunchInfo("torchrun", 0, 2, 0, "127.0.0.1", 5)
    with pytest.raises(ValueError, match="RANK/WORLD_SIZE in the environment"):
        apply_init_args(by_hand, None, world_size=2, rank=1, env={})
    # under minidist.multiprocessing.spawn the arguments win, as under torch's spawn
    spawned = LaunchInfo("torchrun", 0, 1, 0, "127.0.0.1", 5, started_by="spawn")
    info = apply_init_args(spawned, "tcp://10.0.0.1:7", world_size=2, rank=1, env={})
    assert (info.launcher, info.rank, info.world_size, info.master_addr) == (
        "explicit", 1, 2, "10.0.0.1")
    assert apply_init_args(spawned, None, world_size=1, rank=0, env={}).launcher == "torchrun"


def test_spawn_with_the_scripts_own_rank_and_world_size_across_two_nodes():
    # imagenet's --multiprocessing-distributed on two "nodes": each spawns one worker, which
    # passes rank=node, world_size=2 although its spawn set rank 0 of 1
    job = run_env_ranks(2, [REPO / "tests" / "launch" / "spawn_multinode_script.py"],
                        timeout_s=120)
    assert job.returncode == 0, job.report()
    assert "node 0 ok" in job.stdout and "node 1 ok" in job.stdout, job.report()


@pytest.fixture
def clean_env(monkeypatch):
    for k in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "RANK", "WORLD_SIZE",
              "SLURM_PROCID", "MASTER_PORT", "MASTER_ADDR"):
        monkeypatch.delenv(k, raising=False)
    yield
    md.destroy_process_group()


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.mark.skipif(md.xp.gpu_available(), reason="checks the CPU-only message")
def test_nccl_without_a_gpu_says_what_it_runs(clean_env):
    lines = _Lines()
    logging.getLogger("minidist").addHandler(lines)
    try:
        g = md.init_process_group(backend="nccl")
    finally:
        logging.getLogger("minidist").removeHandler(lines)
    assert g.backend == "local"
    assert any("backend='nccl' on a machine without a usable GPU" in m and "local" in m
               for m in lines.lines), lines.lines


def test_torch_positional_order_and_algorithm_keyword(clean_env):
    g = md.init_process_group(None, "env://", 5, algorithm="ring")
    assert g.backend == "local" and md.is_initialized()
    md.destroy_process_group()
    with pytest.raises(ValueError, match="store= and pg_options= are not supported"):
        md.init_process_group(store=object())
