"""DistributedDataParallel.join() with 3, 4, 5 batches on 3 ranks under mpiexec: no hang,
identical parameters, equal to one process averaging over the real batches of each step
(rank body: join_rank.py)."""

import json

import pytest

from procs import run_mpi

pytestmark = pytest.mark.mpi


def test_join_uneven_inputs_match_single_process():
    job = run_mpi(3, ["tests/ddp/join_rank.py"], timeout_s=90)
    assert job.returncode == 0, job.report()
    res = json.loads(next(l for l in job.stdout.splitlines()
                          if l.startswith("RESULT "))[len("RESULT "):])
    assert res["world_size"] == 3
    runs = {k: v for k, v in res.items() if "/" in k}
    assert len(runs) == 4
    bad = {k: v for k, v in runs.items() if not (v["identical"] and v["close"])}
    assert not bad, bad
    initial = res["divide_by_initial_world_size"]
    assert initial["identical"] and initial["close"], initial
