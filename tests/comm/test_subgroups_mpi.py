"""new_group sub-groups (2 of 4 ranks), async_op collectives and Tensor arguments on 4 ranks
under mpiexec and over TCP (rank body: tests/comm/subgroup_rank.py); an async wait that times
out while a peer has not joined (tests/comm/async_timeout_rank.py); new_group's argument errors
in one process."""

import json

import numpy as np
import pytest

from procs import run_env_ranks, run_mpi


def launch(how, n, args, **kw):
    return (run_mpi if how == "mpi" else run_env_ranks)(n, args, **kw)


@pytest.mark.parametrize("how", [pytest.param("mpi", marks=pytest.mark.mpi), "tcp"])
def test_subgroups_async_ops_and_ddp_on_a_subgroup(how):
    job = launch(how, 4, ["tests/comm/subgroup_rank.py"], timeout_s=90)
    assert job.returncode == 0, job.report()
    rows = json.loads(next(l for l in job.stdout.splitlines()
                           if l.startswith("RESULT "))[len("RESULT "):])
    assert [r["group_rank"] for r in rows] == [0, 1, 1, 0]   # high = new_group([3, 2])
    assert [r["sum"] for r in rows] == [3.0, 3.0, 7.0, 7.0]
    assert [r["bcast"] for r in rows] == [0.0, 0.0, 3.0, 3.0]
    assert rows[0]["gathered"] == [0.0, 0.0, 1.0, 1.0]
    assert rows[2]["gathered"] == [3.0, 3.0, 2.0, 2.0]
    assert [r["scattered"] for r in rows] == [1.0, 3.0, 7.0, 5.0]
    # three queued all_reduces of y: 1+2 = 3 -> 6 -> 12 on {0,1}; 3+4 = 7 -> 14 -> 28 on {2,3}
    assert [r["queued"] for r in rows] == [12.0, 12.0, 28.0, 28.0]
    assert [r["world_sum"] for r in rows] == [4.0] * 4
    assert [r["z"] for r in rows] == [1.0, 1.0, 5.0, 5.0]
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


@pytest.mark.parametrize("how", [pytest.param("mpi", marks=pytest.mark.mpi), "tcp"])
def test_async_wait_times_out_while_a_peer_has_not_joined(how, tmp_path):
    job = launch(how, 2, ["tests/comm/async_timeout_rank.py", tmp_path / "joined"],
                 timeout_s=90)
    assert job.returncode == 0, job.report()
    res = json.loads(next(line for line in job.stdout.splitlines()
                          if line.startswith("RESULT "))[len("RESULT "):])
    assert res["pending_before"] is False and res["completed_after_timeout"] is False
    assert res["error_type"] == "CommTimeout"
    assert "[rank 0/2] Work.wait(all_reduce): not complete after 1 s" in res["error"]
    assert "same collectives in the same order" in res["error"]
    assert res["late_wait"] is True and res["sum"] == 3.0 and res["after"] == 2.0
