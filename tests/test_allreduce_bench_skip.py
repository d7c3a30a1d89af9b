"""The all-reduce benchmark skips the rows that cannot run in a job, with a line saying why,
and measures the others: shm and the shared-buffer rows on several (virtual) nodes, the MPI
rows over TCP. tests/cluster/ runs the same across real (namespace) nodes."""

import json

import pytest

from procs import REPO, run_env_ranks, run_mpi

BENCH = REPO / "benchmarks" / "allreduce.py"
TINY = ["--min-bytes", "64", "--max-bytes", "64", "--iters", "2", "--warmup", "1", "--no-plot"]


@pytest.mark.mpi
def test_rows_that_cannot_run_across_nodes_are_skipped(tmp_path):
    res = run_mpi(4, [BENCH, *TINY, "--out", tmp_path], timeout_s=90,
                  env={"MINIDIST_RANKS_PER_NODE": "2", "MINIDIST_TIMEOUT_S": "30"})
    assert res.returncode == 0, res.report()
    for row in ("shm", "shm_zc", "mpi_zc", "auto_zc"):
        assert f"# skipped {row}: " in res.stdout, res.stdout
    assert "span 2 nodes (hier is the multi-node algorithm)" in res.stdout
    data = json.loads((tmp_path / "allreduce_n4.json").read_text())
    assert set(data["skipped"]) == {"shm", "shm_zc", "mpi_zc", "auto_zc"}
    assert {r["algorithm"] for r in data["rows"]} == {"ring", "tree", "rd", "direct", "mpi",
                                                     "auto"}
    assert all(r["wrong"] == 0 for r in data["rows"])


def test_mpi_rows_are_skipped_over_tcp(tmp_path):
    res = run_env_ranks(2, [BENCH, *TINY, "--backend", "tcp", "--no-gloo", "--algorithms",
                            "ring,mpi,mpi_raw,shm_zc", "--out", tmp_path], timeout_s=90)
    assert res.returncode == 0, res.report()
    assert "# skipped mpi: needs the MPI transport (this run's backend: tcp)" in res.stdout
    assert "# skipped mpi_raw: " in res.stdout and "# skipped shm_zc: " in res.stdout
    data = json.loads((tmp_path / "allreduce_n2.json").read_text())
    assert [r["algorithm"] for r in data["rows"]] == ["ring"]
