"""new_group sub-groups (2 of 4 ranks), async_op collectives and Tensor arguments under
mpiexec n=4 (rank body: tests/mpi/subgroup_body.py); new_group's argument errors in one
process."""

import json

import numpy as np
import pytest

from procs import run_mpi


@pytest.mark.mpi
def test_subgroups_async_ops_and_ddp_on_a_subgroup():
    job = run_mpi(4, ["tests/mpi/subgroup_body.py"], timeout_s=90)
    assert job.returncode == 0, job.report()
    rows = json.loads(next(l for l in job.stdout.splitlines()
                           if l.startswith("RESULT "))[len("RESULT "):])
    assert [r["group_rank"] for r in rows] == [0, 1, 1, 0]   # high = new_group([3, 2])
    assert [r["sum"] for r in rows] == [3.0, 3.0, 7.0, 7.0]
    assert [r["bcast"] for r in rows] == [0.0, 0.0, 3.0, 3.0]
    assert rows[0]["gathered"] == [0.0, 0.0, 1.0, 1.0]
    assert rows[2]["gathered"] == [3.0, 3.0, 2.0, 2.0]
    assert [r["scattered"] for r in rows] == [1.0, 3.0, 7.0, 5.0]
    for r in rows:
        assert r["other_is_none"] and r["waited"]
        assert "timeout=-1 is negative" in r["negative_timeout"]
        assert r["ddp_same_in_group"] and r["ddp_differs_across"]


def test_new_group_checks_its_ranks_in_one_process():
    import minidist

    minidist.init_process_group(backend="local")
    try:
        with pytest.raises(ValueError, match=r"ranks must be distinct integers in \[0, 1\)"):
            minidist.new_group([0, 1])
        assert minidist.new_group([0]) is minidist.comm.get_default_group()
        work = minidist.all_reduce(minidist.ones(2), async_op=True)
        assert work.is_completed() and work.wait(timeout=0.1)
        assert np.array_equal(work.result()[0], np.ones(2))
    finally:
        minidist.destroy_process_group()
