"""The TCP transport cannot be joined or crashed by strangers (all on 127.0.0.1).

A 2-rank job starts rank 0 alone; while it waits for rank 1, clients that are not ranks connect
to its rendezvous port (MASTER_PORT) or its data port: an HTTP request, 64 random bytes, a
client that sends nothing, a header announcing a huge message. Then rank 1 starts, and the job
must finish correctly, rank 0 having logged why it dropped each stranger.
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

from minidist.comm.transports import tcp_rendezvous as tcp
from procs import REPO, job_env, kill_group, run_env_ranks

BODY = REPO / "tests" / "multiproc" / "tcp_body.py"


def _rank(r: int, port: int, extra: dict | None = None) -> subprocess.Popen:
    env = job_env({"MINIDIST_TIMEOUT_S": "30", **(extra or {})})
    env.update(RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port))
    return subprocess.Popen([sys.executable, str(BODY), "p2p"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=str(REPO),
                            start_new_session=True)


def _finish(procs: list, timeout_s: float = 60) -> list[tuple[int, str, str]]:
    """(exit code, stdout, stderr) of each rank, under one deadline for all of them."""
    deadline = time.monotonic() + timeout_s
    try:
        return [(p.communicate(timeout=max(0.0, deadline - time.monotonic())) and p.returncode,
                 *p.communicate()) for p in procs]
    finally:
        for p in procs:
            kill_group(p.pid, leader_alive=p.poll() is None)
            if p.poll() is None:
                p.communicate()


def _listening_ports(pid: int) -> set[int]:
    """TCP ports the process listens on (from /proc: its socket inodes in state LISTEN)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    ports = set()
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:
                ports.add(int(cols[1].split(":")[1], 16))
    return ports


def _wait_for_ports(pid: int, want: int, timeout_s: float = 30) -> set[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ports = _listening_ports(pid)
        if len(ports) >= want:
            return ports
        time.sleep(0.05)
    raise AssertionError(f"rank 0 (pid {pid}) did not listen on {want} ports")


def _strangers(port: int, served: bool) -> list[socket.socket]:
    """Connect the five kinds of stranger to 127.0.0.1:port; return the open sockets (``served``:
    the port is being served now, so wait until the last one has said what it has to say)."""
    socks = []
    for payload in (b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",     # a web client
                    bytes(range(64)),                                   # 64 bytes of noise
                    b"",                                                # says nothing
                    struct.pack("<qQ", 0, 1 << 62)):                    # a huge frame header
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(payload)
        socks.append(s)
    # One that speaks the handshake (no token set), then announces a 4 GiB message.
    s = socket.create_connection(("127.0.0.1", port), timeout=20)
    socks.append(s)
    speaker = threading.Thread(target=_huge_after_handshake, args=(s,), daemon=True)
    speaker.start()
    if served:
        speaker.join(timeout=20)
    return socks


def _huge_after_handshake(s: socket.socket) -> None:
    try:
        nonce_c = os.urandom(tcp.NONCE_BYTES)
        s.sendall(tcp.MAGIC + nonce_c)
        reply = b""
        while len(reply) < len(tcp.MAGIC) + tcp.NONCE_BYTES + tcp.MAC_BYTES:
            got = s.recv(100)
            if not got:
                return
            reply += got
        nonce_s = reply[len(tcp.MAGIC):len(tcp.MAGIC) + tcp.NONCE_BYTES]
        s.sendall(tcp._mac(b"", b"client", nonce_s, nonce_c) + struct.pack("<I", 0xFFFFFFFF))
    except OSError:
        pass


@pytest.mark.parametrize("target", ["master", "data"])
def test_strangers_are_dropped_and_the_job_completes(target, port):
    rank0 = _rank(0, port)
    socks = []
    try:
        ports = _wait_for_ports(rank0.pid, 2)
        victim = port if target == "master" else min(ports - {port})
        # Rank 0 serves MASTER_PORT now; its data port only once rank 1 has registered.
        socks = _strangers(victim, served=target == "master")
        rank1 = _rank(1, port)
        (code0, out0, err0), (code1, out1, err1) = _finish([rank0, rank1])
    finally:
        for s in socks:
            s.close()
        if rank0.poll() is None:
            os.killpg(rank0.pid, 9)
    assert code0 == 0 and code1 == 0, err0 + err1
    assert "OK p2p rank 0" in out0 and "OK p2p rank 1" in out1, out0 + out1
    dropped = [line for line in err0.splitlines() if "dropped a connection" in line]
    assert len(dropped) >= 5, err0
    # On the data port the handshake-speaking stranger races rank 1 (both are served at once):
    # dropped for the rank it claims, or as still silent when rank 1 completed the mesh first.
    for reason in ("did not open with minidist's handshake", "still silent"):
        assert any(reason in line for line in dropped), (reason, err0)
    if target == "master":
        assert any("announced a 4294967295-byte" in line for line in dropped), err0
    else:  # the speaker: dropped for its claim, or a second silent one besides the mute stranger
        claims = sum("says it is rank" in line for line in dropped)
        silent = sum("still silent" in line for line in dropped)
        assert claims >= 1 or silent >= 2, err0


def test_ranks_with_different_tokens_both_fail_fast(port):
    procs = [_rank(0, port, {"MINIDIST_AUTH_TOKEN": "alpha"}),
             _rank(1, port, {"MINIDIST_AUTH_TOKEN": "beta"})]
    (code0, _, err0), (code1, _, err1) = _finish(procs, timeout_s=25)
    assert code0 != 0 and "[rank 0/2] rendezvous: a peer failed authentication" in err0, err0
    assert code1 != 0 and "[rank 1/2] handshake with rank 0" in err1, err1
    assert "MINIDIST_AUTH_TOKEN differs" in err1, err1


def test_same_token_joins_and_the_port_is_reusable_at_once(port):
    for _ in range(2):  # the second run binds MASTER_PORT right after the first one ended
        result = run_env_ranks(2, [BODY, "p2p"], timeout_s=60, port=port,
                               env={"MINIDIST_AUTH_TOKEN": "s3cret"})
        assert result.returncode == 0, result.report()


def test_a_silent_client_does_not_delay_the_rendezvous(port):
    """A client that connects to MASTER_PORT and says nothing is given MINIDIST_TCP_HANDSHAKE_S
    (here far beyond the test's bound) to speak; the real ranks register beside it and the job
    ends while the silent client is still connected (rank 0 never closed it on its own)."""
    patient = {"MINIDIST_TCP_HANDSHAKE_S": "600"}
    rank0 = _rank(0, port, patient)
    silent = None
    try:
        _wait_for_ports(rank0.pid, 2)
        silent = socket.create_connection(("127.0.0.1", port), timeout=5)
        rank1 = _rank(1, port, patient)
        (code0, out0, err0), (code1, out1, err1) = _finish([rank0, rank1])
        assert code0 == 0 and code1 == 0, err0 + err1
        assert "OK p2p rank 0" in out0 and "OK p2p rank 1" in out1, out0 + out1
        assert "was still silent when every rank had arrived" in err0, err0  # not after it
    finally:
        if silent is not None:
            silent.close()
        if rank0.poll() is None:
            os.killpg(rank0.pid, 9)
