"""DDP.close(release_buffers=True) under mpiexec -n 2 (see release_rank.py)."""

import json

import pytest

from procs import run_mpi

pytestmark = pytest.mark.mpi


def test_release_buffers_frees_windows_and_keeps_grads():
    job = run_mpi(2, ["tests/ddp/release_rank.py"], timeout_s=60)
    assert job.returncode == 0, job.report()
    line = next(l for l in job.stdout.splitlines() if l.startswith("RESULT "))
    res = json.loads(line[len("RESULT "):])
    assert res["windows_after_close"] == [0, 0, 0, 0]
    assert res["same_grads"] and res["grads_nonzero"]
