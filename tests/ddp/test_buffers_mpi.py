"""DDP broadcast_buffers=True keeps BatchNorm running statistics identical across ranks
(rank body: buffers_rank_script.py)."""

import json

import pytest

from procs import run_mpi

pytestmark = pytest.mark.mpi


def test_broadcast_buffers_keeps_running_stats_identical():
    job = run_mpi(2, ["tests/ddp/buffers_rank_script.py"], timeout_s=90)
    assert job.returncode == 0, job.report()
    res = json.loads(next(l for l in job.stdout.splitlines()
                          if l.startswith("RESULT "))[len("RESULT "):])
    # each step: one no_sync forward + one synced forward update the statistics (eval: none)
    assert res["on"]["tracked"] == res["off"]["tracked"]
    assert res["on"]["identical"], res
    assert not res["off"]["identical"], res
