"""The all-reduce benchmark skips the rows that cannot run in a job, with a line saying why,
and measures the others: shm and the shared-buffer rows on several (virtual) nodes, the MPI
rows over TCP. tests/cluster/ runs the same across real (namespace) nodes."""

import json
import sys

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
    data = json.loads((tmp_path / "allreduce_mpi_2x2.json").read_text())  # named by its nodes
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
    data = json.loads((tmp_path / "allreduce_tcp_1x2.json").read_text())  # named by transport
    assert [r["algorithm"] for r in data["rows"]] == ["ring"]


def test_a_tcp_run_is_named_and_titled_by_its_transport_and_shows_progress(tmp_path):
    res = run_env_ranks(2, [BENCH, "--min-bytes", "64", "--max-bytes", "256", "--step", "4",
                            "--iters", "2", "--warmup", "1", "--backend", "tcp", "--no-gloo",
                            "--algorithms", "ring,hier,auto", "--note", "1 Gbit links",
                            "--out", tmp_path], timeout_s=90)
    assert res.returncode == 0, res.report()
    data = json.loads((tmp_path / "allreduce_tcp_1x2.json").read_text())
    assert data["note"] == "1 Gbit links" and data["backend"] == "tcp"
    assert "# progress: 1/2 sizes in " in res.stderr and " s left" in res.stderr, res.report()
    assert "'vs raw'" not in res.stdout and "'vs best' = auto / the fastest of " \
        "ring/tree/rd/direct/shm/hier" in res.stdout, res.stdout   # no mpi_raw row: no column
    sys.path.insert(0, str(BENCH.parent))
    from allreduce import plot_title

    assert plot_title(data) == "all_reduce, 2 ranks, TCP transport, 1 Gbit links, float32 sum"
