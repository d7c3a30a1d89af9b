"""A job that cannot start says why in one line for the whole job, with minidist's own advice.

Before: a traceback per rank (12 lines for one rank with ``WORLD_SIZE=four``, 44 for
``WORLD_SIZE=2`` under ``mpiexec -n 4``, 45 for a launcher whose second node never came), advice
naming torchrun, and a bad ``MINIDIST_*`` value found only where it is first read (or never).
"""

from __future__ import annotations

import pytest

from procs import REPO, run_env_ranks, run_mpi, run_python

SCRIPT = REPO / "tests" / "launch" / "startup_rank.py"


def one_line(job, code: int) -> str:
    lines = [ln for ln in job.stderr.splitlines() if ln.strip()]
    assert job.returncode == code, job.report()
    assert len(lines) == 1 and "Traceback" not in job.stderr, job.report()
    assert "torchrun" not in lines[0], lines[0]
    return lines[0]


def _by_hand(env: dict):
    """One process with launcher variables set by hand (RANK, WORLD_SIZE, MASTER_*)."""
    return run_python([SCRIPT], timeout_s=60, env={"MASTER_ADDR": "127.0.0.1",
                                                  "MINIDIST_RUN_ID": "startup", **env})


@pytest.mark.parametrize("env,says", [
    ({"RANK": "0", "WORLD_SIZE": "four", "MASTER_PORT": "29500"},
     "WORLD_SIZE='four' is not an integer"),
    ({"RANK": "4", "WORLD_SIZE": "4", "MASTER_PORT": "29500"},
     "RANK=4 but WORLD_SIZE=4; a rank must be in [0, 4)"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "abc"}, "MASTER_PORT='abc' is not an integer"),
])
def test_a_bad_launcher_variable_is_one_line_with_minidist_advice(env, says):
    line = one_line(_by_hand(env), 2)
    assert line.startswith("minidist: ") and says in line, line
    assert "python -m minidist.launch --nproc-per-node" in line, line


@pytest.mark.mpi
def test_world_size_that_disagrees_with_mpiexec_is_one_line_for_the_job():
    line = one_line(run_mpi(4, [SCRIPT], timeout_s=60, env={"WORLD_SIZE": "2"}), 2)
    assert "started 4 ranks but WORLD_SIZE=2" in line and "./mpirun.sh -n 2" in line, line


def test_a_node_that_never_comes_is_one_launcher_line():
    job = run_python(["-m", "minidist.launch", "--nnodes", "2", "--nproc-per-node", "2",
                      "--master-port", str(_port()), "--rdzv-id", "startup", SCRIPT],
                     timeout_s=90, env={"MINIDIST_TIMEOUT_S": "5", "MINIDIST_AUTH_TOKEN": "s"})
    line = one_line(job, 1)
    assert line.startswith("[minidist.launch] rank 0 exited with code 1; stopped the other "
                           "ranks. minidist: [rank 0/4] rendezvous: ranks [2, 3] did not "
                           "register"), line


def test_world_sizes_that_disagree_at_the_rendezvous_are_one_line_per_rank():
    """Ranks started by hand: each terminal gets its own line, none a traceback."""
    job = run_env_ranks(2, [SCRIPT], timeout_s=60, env={"MINIDIST_TIMEOUT_S": "20"})
    assert job.returncode == 0, job.report()  # the same WORLD_SIZE: the body runs
    port = _port()
    a = _by_hand_bg({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": str(port)})
    b = _by_hand({"RANK": "1", "WORLD_SIZE": "3", "MASTER_PORT": str(port),
                  "MINIDIST_TIMEOUT_S": "20"})
    out_a = a.finish()
    for job in (b, out_a):
        line = one_line(job, 1)
        assert "world size mismatch: rank 1 has WORLD_SIZE=3 but rank 0 has WORLD_SIZE=2" in line


@pytest.mark.mpi
@pytest.mark.parametrize("name,value", [("MINIDIST_CUDA_JIT", "x"), ("MINIDIST_KERNELS", "fast"),
                                        ("MINIDIST_CUDA_AWARE_MPI", "x")])
def test_a_bad_minidist_value_ends_the_job_at_the_start_in_one_line(name, value):
    """Read only on the GPU path or by an AMP kernel: before, passed silently on the CPU or
    failed at the first bucket with a 60-line traceback."""
    line = one_line(run_mpi(2, [SCRIPT], timeout_s=60, env={name: value}), 2)
    assert line.startswith(f"minidist: {name}='{value}' is not valid"), line


@pytest.mark.mpi
def test_a_trace_folder_that_is_a_file_is_refused_before_training(tmp_path):
    a_file = tmp_path / "trace"
    a_file.write_text("not a folder")
    job = run_mpi(2, [REPO / "examples" / "train.py", "--epochs", "1", "--hidden", "16"],
                  timeout_s=90, env={"MINIDIST_TRACE": str(a_file)})
    line = one_line(job, 2)
    assert line.startswith(f"minidist: MINIDIST_TRACE='{a_file}' is not valid"), line
    assert "epoch 1/" not in job.stdout, job.report()


@pytest.mark.mpi
def test_an_unknown_minidist_name_gets_one_warning_naming_the_closest():
    job = run_mpi(2, [SCRIPT], timeout_s=60, env={"MINIDIST_TIMEOUT": "10"})
    assert job.returncode == 0, job.report()
    warned = [ln for ln in job.stderr.splitlines() if "MINIDIST_TIMEOUT is not" in ln]
    assert len(warned) == 1, job.report()
    assert "(did you mean MINIDIST_TIMEOUT_S?)" in warned[0], warned


def _port() -> int:
    from procs import free_port
    return free_port()


class _Background:
    def __init__(self, env: dict) -> None:
        import subprocess
        import sys

        from procs import job_env
        self.p = subprocess.Popen([sys.executable, str(SCRIPT)], cwd=str(REPO), text=True,
                                  env=job_env({"MASTER_ADDR": "127.0.0.1",
                                               "MINIDIST_RUN_ID": "startup",
                                               "MINIDIST_TIMEOUT_S": "20", **env}),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  start_new_session=True)

    def finish(self):
        from procs import JobResult, _kill
        try:
            out, err = self.p.communicate(timeout=60)
        finally:
            _kill([self.p])
        return JobResult(self.p.returncode, out, err, ["rank 0"])


def _by_hand_bg(env: dict) -> _Background:
    return _Background(env)
