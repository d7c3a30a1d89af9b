"""SyncBatchNorm at n=2 under mpiexec equals BatchNorm on the full batch: outputs, input and
parameter gradients, running statistics; DDP with it follows full-batch training
(rank body: syncbn_rank.py)."""

import json

import pytest

from procs import run_mpi

pytestmark = pytest.mark.mpi


def test_sync_batchnorm_equals_full_batch_batchnorm():
    job = run_mpi(2, ["tests/ddp/syncbn_rank.py"], timeout_s=120)
    assert job.returncode == 0, job.report()
    ranks = json.loads(next(l for l in job.stdout.splitlines()
                            if l.startswith("RESULT "))[len("RESULT "):])
    assert len(ranks) == 2
    for res in ranks:
        for case in ("bn1d", "bn1d_3d", "bn2d"):
            r = res[case]
            assert r["type"] == "SyncBatchNorm", r
            for key in ("out", "grad_x", "grad_w", "grad_b", "running_mean", "running_var"):
                assert r[key] < 1e-10, (case, key, r)
        assert res["ddp"]["overlap_refused"] and res["ddp"]["overlap"] is False, res["ddp"]
        assert res["ddp"]["state_err"] < 1e-10, res["ddp"]
