"""benchmarks/call_count.py: one small md.all_reduce makes at most 16 function calls.

A count, not a time: cProfile's calls per all_reduce at n=2 over MPI with the defaults (ledger
on), the calls of a wait for the peer left out (they grow with the machine's load). Each layer
of the call (validate and plan, the ledger row, the fingerprint guard, the mailbox or MPI's
post and wait) is counted; a change that adds a function call to every collective fails here. ``--stages``
prints what each part of the call costs (checked for its parts, not for their times).
"""

import json

import pytest

from procs import REPO, run_python

BUDGET = 16  # calls per all_reduce (8 B and 1 KiB)


@pytest.mark.parametrize("algorithm,runs", [("auto", "shm"), ("mpi", "mpi")])
def test_a_small_all_reduce_makes_at_most_16_calls(tmp_path, algorithm, runs):
    # the default ("auto": the shared-memory mailboxes on one node) and MPI's guarded Allreduce
    for nbytes in (8, 1024):
        job = run_python([REPO / "benchmarks" / "call_count.py", "--bytes", str(nbytes),
                          "--calls", "300", "--algorithm", algorithm, "--out", tmp_path],
                         timeout_s=240)
        assert job.returncode == 0, job.report()
        result = json.loads((tmp_path / "call_count.json").read_text())
        assert result["nbytes"] == nbytes and result["algorithm"] == runs, result
        assert result["per_call"] <= BUDGET + 0.05, job.stdout


def test_stages_names_every_part_of_the_call(tmp_path):
    job = run_python([REPO / "benchmarks" / "call_count.py", "--stages", "--calls", "50",
                      "--out", tmp_path], timeout_s=240)
    assert job.returncode == 0, job.report()
    result = json.loads((tmp_path / "call_stages.json").read_text())
    parts = result["us"]
    assert len(parts) == 8 and all(v > 0 for v in parts.values()), parts
    assert "MPI Allreduce (mpi4py, blocking)" in parts and "group.all_reduce" in parts
    assert all(name in job.stdout for name in parts), job.stdout
