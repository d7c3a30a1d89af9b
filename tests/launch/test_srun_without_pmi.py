"""A task that srun started without PMI (``srun --mpi=none`` under MPI) is an MPI world of
its own: init_process_group must refuse it instead of training N unrelated copies.
tests/cluster/test_slurm.py sees the same under a real srun."""

from __future__ import annotations

import subprocess
import sys

from procs import REPO, job_env

CODE = "import minidist as md; md.init_process_group(); print('INITIALISED', md.get_world_size())"


def run_task(rank: int) -> subprocess.CompletedProcess:
    env = job_env({"SLURM_PROCID": str(rank), "SLURM_NTASKS": "2", "SLURM_LOCALID": "0"})
    return subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=60, stdin=subprocess.DEVNULL)


def test_srun_task_without_pmi_is_refused_naming_the_plugin():
    first, second = run_task(0), run_task(1)  # each alone: what srun --mpi=none starts
    for res in (first, second):
        assert res.returncode != 0 and "INITIALISED" not in res.stdout, res
    # one line, from rank 0 (the startup errors of the other ranks would repeat it)
    assert "[rank 0/2] init_process_group: srun started 2 tasks but MPI sees 1" in \
        first.stderr and "srun --mpi=pmi2" in first.stderr, first.stderr
