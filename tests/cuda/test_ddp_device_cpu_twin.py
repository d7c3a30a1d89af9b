"""CPU twin of test_staging_gpu.py's DDP check: the same rank script under mpiexec, with the
model on the CPU (the comparison and the equal-on-every-rank check run; no staging)."""

import pytest

from procs import REPO, run_mpi


@pytest.mark.mpi
def test_ddp_device_script_cpu_twin():
    res = run_mpi(2, [REPO / "tests" / "cuda" / "ddp_device_rank.py", "cpu"],
                  timeout_s=120)
    assert res.returncode == 0, res.report()
    assert res.stdout.count("ddp device == host ok (cpu)") == 2, res.report()
