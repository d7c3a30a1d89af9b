"""The TCP transport with real processes on 127.0.0.1 (torchrun-style env: RANK, MASTER_PORT...).

Each test starts ranks with tests/procs.py (killed on timeout or failure) running
tests/tcp/tcp_rank.py; a short MINIDIST_TIMEOUT_S makes any hang fail fast.
"""

import socket
import subprocess
import sys

import pytest

from procs import REPO, free_port, job_env, reserved_ports, run_env_ranks

BODY = REPO / "tests" / "tcp" / "tcp_rank.py"
ENV = {"MINIDIST_TIMEOUT_S": "10"}


@pytest.mark.parametrize("n", [2, 3, 4])
def test_point_to_point(n):
    res = run_env_ranks(n, [BODY, "p2p"], timeout_s=60, env=ENV)
    assert res.returncode == 0, res.report()
    assert res.stdout.count("OK p2p") == n, res.report()


@pytest.mark.parametrize("n", [2, 3, 4])
def test_all_reduce_algorithms_over_tcp(n):
    res = run_env_ranks(n, [BODY, "allreduce"], timeout_s=80, env=ENV)
    assert res.returncode == 0, res.report()
    assert res.stdout.count("OK allreduce") == n, res.report()


@pytest.mark.parametrize("mode", ["threads", "mismatch"])
def test_threads_share_the_sockets_and_a_mismatch_keeps_the_stream(mode):
    res = run_env_ranks(3, [BODY, mode], timeout_s=60, env=ENV)
    assert res.returncode == 0, res.report()
    assert res.stdout.count(f"OK {mode}") == 3, res.report()


def test_one_rank_job_needs_no_one_to_register():
    res = run_env_ranks(1, [BODY, "p2p"], timeout_s=60, env=ENV)
    assert res.returncode == 0 and "OK p2p rank 0" in res.stdout, res.report()


def test_dead_peer_raises_comm_error_naming_it():
    res = run_env_ranks(3, [BODY, "die"], timeout_s=60, env=ENV)
    # rank 2 exits with 3 on purpose; ranks 0 and 1 must report it instead of hanging.
    assert res.stdout.count("CAUGHT") == 2, res.report()
    assert "connection to rank 2 lost" in res.stdout, res.report()


def _spawn(rank, world_size, port, timeout_s="3"):
    env = job_env({"RANK": str(rank), "WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": str(port), "MINIDIST_TIMEOUT_S": timeout_s})
    return subprocess.run([sys.executable, str(BODY), "connect"], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=30)


def test_busy_master_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        res = _spawn(0, 2, s.getsockname()[1])
    assert res.returncode != 0
    assert "address already in use" in res.stderr and "MASTER_PORT=" in res.stderr, res.stderr


def test_rank0_never_shows_up_times_out(port):
    res = _spawn(1, 2, port, timeout_s="1.5")
    assert res.returncode != 0
    assert "CommTimeout" in res.stderr and f"127.0.0.1:{port}" in res.stderr, res.stderr


def test_world_size_mismatch_names_both_values(port):
    procs = []
    try:
        for rank, ws in ((0, 2), (1, 3)):
            env = job_env({"RANK": str(rank), "WORLD_SIZE": str(ws), "MASTER_ADDR": "127.0.0.1",
                           "MASTER_PORT": str(port), "MINIDIST_TIMEOUT_S": "5"})
            procs.append(subprocess.Popen([sys.executable, str(BODY), "connect"], env=env,
                                          cwd=REPO, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
        outs = [p.communicate(timeout=30) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, (_, err) in zip(procs, outs):
        assert p.returncode != 0
        assert "world size mismatch" in err and "WORLD_SIZE=3" in err and "WORLD_SIZE=2" in err, err


def test_bad_rank_is_a_value_error():
    from minidist.tcp.transport import TCPTransport

    with pytest.raises(ValueError, match="rank 5 is not in"):
        TCPTransport(5, 2, "127.0.0.1", free_port(), timeout_s=1)


def test_rendezvous_beside_torchruns_store():
    """Under a real torchrun (TORCHELASTIC_RUN_ID set) the agent's own store holds MASTER_PORT:
    the ranks must meet beside it instead of failing with "address already in use"."""
    with reserved_ports(2) as port, socket.socket() as agent_store:  # the ranks meet at + 1
        # agent_store stands in for torchrun's TCPStore on MASTER_PORT
        agent_store.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        agent_store.bind(("127.0.0.1", port))
        agent_store.listen()
        res = run_env_ranks(2, [REPO / "tests" / "tcp" / "torchrun_rank.py"], timeout_s=60,
                            env={**ENV, "TORCHELASTIC_RUN_ID": "test-run"}, port=port)
    assert res.returncode == 0, res.report()
    assert res.stdout.count("sum 3") == 2, res.report()


def test_torchrun_case_names_the_port_it_needs_when_the_next_one_is_taken():
    with reserved_ports(2) as port, socket.socket() as agent_store, \
            socket.socket() as other_job:
        for s, p in ((agent_store, port), (other_job, port + 1)):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", p))
        agent_store.listen()  # MASTER_PORT + 1 is taken by someone else below
        other_job.listen()
        res = run_env_ranks(2, [REPO / "tests" / "tcp" / "torchrun_rank.py"], timeout_s=60,
                            env={**ENV, "TORCHELASTIC_RUN_ID": "test-run",
                                 "MINIDIST_TIMEOUT_S": "3"}, port=port)
    assert res.returncode != 0, res.report()
    assert (f"the TCP rendezvous needs port {port + 1} (MASTER_PORT + 1, since torchrun's agent "
            f"holds MASTER_PORT={port})") in res.stderr, res.report()
    assert "MINIDIST_RENDEZVOUS_PORT" in res.stderr, res.report()
