"""Multi-node on one machine: 2 namespace nodes x 2 ranks (minidist.testing.cluster).

Real nodes (one network namespace and one host name each, joined by a bridge): training over
TCP and MPI equals one process on the global batch, the collectives check with hier and auto,
and the failures of a real network: a cut link, a killed node, a node started late, a wrong
auth token. Needs root and ``ip``; elsewhere the module skips with one line saying why.
Select with ``./test.sh -m cluster``.
"""

from __future__ import annotations

import json
import re
import sys
import time

import pytest
from procs import REPO, job_env

from minidist.testing.cluster import Cluster, unavailable_reason

REASON = unavailable_reason()
if REASON is not None:
    pytest.skip(f"cluster tests: minidist.testing.cluster {REASON}", allow_module_level=True)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]

BODY = "tests/cluster/cluster_rank.py"
LOOP = "tests/cluster/loop_rank.py"
DISAGREE = "same model and the same steps"
TIMEOUT_S = 5  # MINIDIST_TIMEOUT_S of the failure tests


@pytest.fixture
def cluster():
    """Two nodes, torn down after the test whatever happened; nothing may be left inside."""
    with Cluster(nodes=2) as c:
        yield c


def env(**extra: str) -> dict:
    return job_env({"MINIDIST_LOG_LEVEL": "WARNING", **extra})


def report(results) -> str:
    return "\n".join(r.report() for r in results)


def result_line(text: str) -> dict:
    line = next((x for x in text.splitlines() if "RESULT " in x), None)
    assert line is not None, text[-3000:]
    return json.loads(line.split("RESULT ", 1)[1])


def check_body(res: dict) -> None:
    assert res["n"] == 4 and res["nodes"] == [[0, 1], [2, 3]] and not res["virtual"], res
    assert res["bad"] == [], res["bad"]
    assert "span 2 nodes" in res["shm_error"], res["shm_error"]
    assert res["auto_choice_1M"] == "hier", res
    for algo in ("hier", "auto"):
        assert res[f"ddp/{algo}"] == {"close": True, "identical": True}, (algo, res)


def no_process_left(c: Cluster) -> None:
    left = {i: c.pids(i) for i in range(c.num_nodes)}
    assert not any(left.values()), f"processes left inside the nodes: {left}"


def test_training_and_collectives_over_tcp(cluster):
    results = cluster.wait(cluster.launch_tcp([BODY], 2, env(), cwd=str(REPO)), timeout_s=90)
    assert [r.returncode for r in results] == [0, 0], report(results)
    res = result_line(results[0].stdout)
    assert res["backend"] == "tcp"
    check_body(res)
    no_process_left(cluster)


def test_training_and_collectives_over_mpi(cluster):
    job = cluster.launch_mpi([sys.executable, BODY], 2, env(), cwd=str(REPO))
    (result,) = cluster.wait([job], timeout_s=90)
    assert result.returncode == 0, result.report()
    res = result_line(result.stdout)
    assert res["backend"] == "mpi"
    check_body(res)
    no_process_left(cluster)


def wait_for_steps(jobs, steps: int = 3, timeout_s: float = 60) -> None:
    """Until every node's ranks have printed ``STEP steps``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(sum(f"STEP {steps}" in line for line in j.out) >= 2 for j in jobs):
            return
        assert all(j.poll() is None for j in jobs), "\n".join(j.result().report() for j in jobs)
        time.sleep(0.05)
    raise AssertionError("the ranks did not reach step 3:\n" +
                         "\n".join("".join(j.out[-5:]) + "".join(j.err[-5:]) for j in jobs))


def test_cut_link_ends_every_rank_naming_the_peer(cluster):
    jobs = cluster.launch_tcp([LOOP], 2, env(MINIDIST_TIMEOUT_S=str(TIMEOUT_S)), cwd=str(REPO))
    wait_for_steps(jobs)
    cluster.link(1, up=False)
    t0 = time.monotonic()
    results = cluster.wait(jobs, timeout_s=TIMEOUT_S + 30)
    took = max(j.ended or time.monotonic() for j in jobs) - t0
    assert all(r.returncode not in (0, None) for r in results), report(results)
    assert took <= TIMEOUT_S + 10, f"ranks ended {took:.1f} s after the cut\n{report(results)}"
    for r, peer in zip(results, ("[Rr]anks? 2", "[Rr]anks? 0")):  # a rank of the other node
        failed = [x for x in r.stdout.splitlines() if "FAILED:" in x]
        assert failed, r.report()
        text = "\n".join(failed)
        assert re.search(peer, text) and "stopped answering" in text, r.report()
        assert DISAGREE not in r.stdout + r.stderr and ".." not in text, r.report()
    print(f"ended {took:.1f} s after the cut (MINIDIST_TIMEOUT_S={TIMEOUT_S})\n{report(results)}")
    no_process_left(cluster)


def test_killed_node_is_named(cluster):
    jobs = cluster.launch_tcp([LOOP], 2, env(MINIDIST_TIMEOUT_S=str(TIMEOUT_S)), cwd=str(REPO))
    wait_for_steps(jobs)
    cluster.kill_node(1)
    results = cluster.wait(jobs, timeout_s=TIMEOUT_S + 30)
    node0 = results[0]
    assert node0.returncode not in (0, None), node0.report()
    failed = "\n".join(x for x in node0.stdout.splitlines() if "FAILED:" in x)
    assert ("rank 2" in failed or "rank 3" in failed) and "stopped answering" in failed, \
        node0.report()
    assert DISAGREE not in failed, failed
    no_process_left(cluster)


def test_node_started_10s_late_is_waited_for(cluster):
    """Twice the failure policy's wait notice (5 s): node 0 says whom it waits for, and waits."""
    jobs = cluster.launch_tcp(["tests/tcp/torchrun_rank.py"], 2, env(),
                              delays={1: 10.0}, cwd=str(REPO))
    results = cluster.wait(jobs, timeout_s=70)
    assert [r.returncode for r in results] == [0, 0], report(results)
    assert results[0].elapsed_s >= 10, report(results)
    out = results[0].stdout + results[1].stdout
    assert all(f"OK torchrun rank {r} sum 10" in out for r in range(4)), report(results)


def test_wrong_auth_token_is_refused_fast(cluster):
    """Node 1's ranks check rank 0's HMAC and fail at once (node 1's first rank reports to its
    launcher without waiting for rank 0, which runs under another launcher); to rank 0 their
    connections are strangers (one warning each), so it waits for its ranks until its timeout,
    and then names the host whose connections failed authentication."""
    jobs = cluster.launch_tcp(["tests/tcp/torchrun_rank.py"], 2,
                              env(MINIDIST_AUTH_TOKEN="right", MINIDIST_TIMEOUT_S="10"),
                              node_env={1: {"MINIDIST_AUTH_TOKEN": "wrong"}}, cwd=str(REPO))
    results = cluster.wait(jobs, timeout_s=60)
    assert all(r.returncode not in (0, None) for r in results), report(results)
    assert results[1].elapsed_s < 7, report(results)  # at once: seconds, not a wait
    assert results[0].elapsed_s >= 10, report(results)  # its MINIDIST_TIMEOUT_S
    assert "MINIDIST_AUTH_TOKEN differs" in results[1].stderr, results[1].report()
    node1 = cluster.nodes[1].addr
    assert f"dropped a connection from {node1}:" in results[0].stderr, results[0].report()
    assert f"Connections from {node1} failed authentication" in results[0].stderr, \
        results[0].report()
    no_process_left(cluster)
