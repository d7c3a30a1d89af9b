"""DDP's gradients equal one process's, bit for bit, over thread ranks (ddp_grad_matrix.py
holds the cases and the oracle): bucket layouts, find_unused_parameters, overlap, no_sync and
require_backward_grad_sync accumulation, user-assigned gradients."""

import json

import pytest

from ddp_grad_matrix import BLOCKS, MPI_BLOCKS, SUBCASES, check_block, run_block
from procs import REPO, run_mpi
from minidist import comm
from minidist.comm.transports.threads import run_threads


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_ddp_grads_match_one_process(group, block):
    got = run_threads(2, lambda t: run_block(block, comm.new_group_from_transport(t), t.rank,
                                             2), timeout_s=60)
    problems = check_block(block, dict(enumerate(got)), 2)
    assert not problems, "\n".join(problems)


@pytest.mark.mpi
def test_ddp_grads_match_one_process_under_mpiexec():
    # One launch runs the cases with several buckets on two real ranks (MPI transport, the
    # shared-memory all-reduce); each rank checks its own gradients against the oracle.
    job = run_mpi(2, [REPO / "tests" / "ddp" / "grad_matrix_rank.py"], timeout_s=120)
    assert job.returncode == 0, job.report()
    line = next(s for s in job.stdout.splitlines() if s.startswith("RESULT "))
    res = json.loads(line[len("RESULT "):])
    assert res["world_size"] == 2 and res["cases"] == len(MPI_BLOCKS) * len(SUBCASES)
    assert not res["problems"], "\n".join(res["problems"])
