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

import json
import tempfile
from pathlib import Path

import pytest

from minidist.tcp import rendezvous as tcp
from procs import REPO, job_env, kill_group, readline_within, run_env_ranks

BODY = REPO / "tests" / "tcp" / "tcp_rank.py"


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
        s.sendall(tcp.handshake_mac(b"", b"client", nonce_s, nonce_c) + struct.pack("<I", 0xFFFFFFFF))
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


def test_a_rank_with_another_token_fails_at_once_and_the_job_still_forms(port):
    """A wrong token is the joiner's error (it checks rank 0's HMAC), and a stranger to rank 0:
    one warning, and rank 0 goes on waiting for its real rank 1."""
    rank0 = _rank(0, port, {"MINIDIST_AUTH_TOKEN": "alpha"})
    try:
        (code1, _, err1), = _finish([_rank(1, port, {"MINIDIST_AUTH_TOKEN": "beta"})], 25)
        assert code1 != 0 and "[rank 1/2] handshake with rank 0" in err1, err1
        assert "MINIDIST_AUTH_TOKEN differs" in err1, err1
        assert rank0.poll() is None  # still waiting for its rank 1
        rank1 = _rank(1, port, {"MINIDIST_AUTH_TOKEN": "alpha"})
        (code0, out0, err0), (code1, out1, err1) = _finish([rank0, rank1])
    finally:
        if rank0.poll() is None:
            os.killpg(rank0.pid, 9)
    assert code0 == 0 and code1 == 0, err0 + err1
    assert "OK p2p rank 0" in out0 and "OK p2p rank 1" in out1, out0 + out1
    assert "failed authentication" in err0 and "dropped a connection from 127.0.0.1" in err0, err0


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


# ---- strangers with a token set, in every phase; job identity; a stolen slot ---------------

ATTACK = REPO / "tests" / "tcp" / "attack_rank.py"
TOKEN = "s3cret"


def _handshake(s: socket.socket, key: bytes, mac_for=None) -> bytes:
    """Speak the client side of the handshake on ``s``: MAGIC and a nonce, read the server's
    answer, send an HMAC made with ``key`` (over ``mac_for``'s nonces, if given: a replay of an
    earlier session's proof). Returns the rest of what the server sends (b"" once it closed)."""
    nonce_c = os.urandom(tcp.NONCE_BYTES)
    s.sendall(tcp.MAGIC + nonce_c)
    reply = b""
    while len(reply) < len(tcp.MAGIC) + tcp.NONCE_BYTES + tcp.MAC_BYTES:
        got = s.recv(100)
        if not got:
            return b""
        reply += got
    nonce_s = reply[len(tcp.MAGIC):len(tcp.MAGIC) + tcp.NONCE_BYTES]
    old_s, old_c = mac_for if mac_for else (nonce_s, nonce_c)
    s.sendall(tcp.handshake_mac(key, b"client", old_s, old_c))
    return b"x"


def _attacker(port: int, kind: str, closed: list) -> None:
    """One stranger on 127.0.0.1:port: ``garbage``, ``wrong-mac`` or ``replay``; appends
    (kind, port) to ``closed`` once the job has closed the connection (or refused it)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=40) as s:
            if kind == "garbage":
                s.sendall(os.urandom(64))
            elif kind == "wrong-mac":
                _handshake(s, os.urandom(16))
            else:  # a proof made with the right token, for another session's nonces
                _handshake(s, TOKEN.encode(), mac_for=(os.urandom(16), os.urandom(16)))
            s.sendall(struct.pack("<I", 60) + json.dumps(
                {"rank": 1, "world_size": 3, "host": "127.0.0.1", "port": 1}).encode()[:60])
            while s.recv(4096):
                pass
    except OSError:
        pass  # refused, reset or closed: the job would not talk to it
    closed.append((kind, port))


def _attack(ports: set[int], closed: list) -> list[threading.Thread]:
    threads = [threading.Thread(target=_attacker, args=(p, kind, closed), daemon=True)
               for p in sorted(ports) for kind in ("garbage", "wrong-mac", "replay")]
    for t in threads:
        t.start()
    return threads


def _attack_rank(r: int, port: int, go: str) -> subprocess.Popen:
    env = job_env({"MINIDIST_TIMEOUT_S": "60", "MINIDIST_AUTH_TOKEN": TOKEN, "GO_FILE": go})
    env.update(RANK=str(r), WORLD_SIZE="3", LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port))
    return subprocess.Popen([sys.executable, str(ATTACK)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=str(REPO),
                            start_new_session=True)


def test_garbage_wrong_mac_and_replay_on_every_port_change_nothing(port):
    """A 3-rank job with MINIDIST_AUTH_TOKEN: garbage, a wrong HMAC and a replayed proof hit
    MASTER_PORT and rank 0's data port while rank 0 waits alone (rendezvous), rank 1's data port
    and MASTER_PORT again while rank 2 is missing (served in the mesh), and every port again
    while the job runs. No rank fails, each stranger is dropped, and the final loss and
    weights are bit-identical to a clean run's."""
    clean = run_env_ranks(3, [ATTACK], timeout_s=90, env={"MINIDIST_AUTH_TOKEN": TOKEN})
    assert clean.returncode == 0, clean.report()
    final = [line for line in clean.stdout.splitlines() if line.startswith("FINAL")]
    closed: list = []
    threads: list[threading.Thread] = []
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory() as tmp:
        go = str(Path(tmp) / "go")
        try:
            procs.append(_attack_rank(0, port, go))
            ports0 = _wait_for_ports(procs[0].pid, 2)
            threads += _attack(ports0, closed)  # rendezvous (rank 0's data port: mesh)
            deadline = time.monotonic() + 30  # MASTER_PORT is served now: dropped now
            while sum(p == port for _, p in closed) < 3 and time.monotonic() < deadline:
                time.sleep(0.05)
            procs.append(_attack_rank(1, port, go))
            ports1 = _wait_for_ports(procs[1].pid, 1)
            threads += _attack(ports1 | {port}, closed)
            time.sleep(1.0)
            procs.append(_attack_rank(2, port, go))
            for p in procs:
                assert readline_within(p.stdout, 60).strip() == "MESH UP"
            threads += _attack(ports0 | ports1, closed)  # the running job: every port again
            for t in threads:
                t.join(timeout=30)
            Path(go).touch()
            results = _finish(procs, timeout_s=60)
        finally:
            Path(go).touch()
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, 9)
    errors = "".join(err for _, _, err in results)
    assert [code for code, _, _ in results] == [0, 0, 0], errors
    assert [line for line in results[0][1].splitlines() if line.startswith("FINAL")] == final
    assert len(closed) == len(threads), (closed, len(threads))  # none still hangs on
    dropped = [line for line in errors.splitlines() if "dropped a connection" in line]
    assert sum("failed authentication" in line for line in dropped) >= 4, errors  # 2 x MASTER
    assert any("data port" in line for line in results[0][2].splitlines()), results[0][2]
    assert any("data port" in line for line in results[1][2].splitlines()), results[1][2]
    assert "this job has no identity" in results[0][2]  # started by hand without a run id


def test_two_jobs_on_one_port_never_swap_ranks(port):
    """Job A's rank 0 and job B's rank 1 meet on one port: B's rank is refused at once with
    both run ids in one line, and A's own rank 1 then completes job A."""
    a0 = _rank(0, port, {"MINIDIST_RUN_ID": "jobA"})
    try:
        (code, _, err), = _finish([_rank(1, port, {"MINIDIST_RUN_ID": "jobB"})], 25)
        assert code != 0, err
        refusal = [line for line in err.splitlines() if "tried to join job" in line]
        assert len(refusal) == 1 and "'jobB'" in refusal[0] and "'jobA'" in refusal[0], err
        (code0, out0, err0), (code1, out1, err1) = _finish(
            [a0, _rank(1, port, {"MINIDIST_RUN_ID": "jobA"})])
    finally:
        if a0.poll() is None:
            os.killpg(a0.pid, 9)
    assert code0 == 0 and code1 == 0, err0 + err1
    assert "OK p2p rank 0" in out0 and "OK p2p rank 1" in out1, out0 + out1
    assert "'jobB'" in err0 and "this job has no identity" not in err0, err0


def test_a_rank_whose_slot_was_taken_learns_it_at_once(port):
    """Without a token, a stranger registers as rank 1 first. The real rank 1 is told at once
    who took its slot (not left to retry until MINIDIST_TIMEOUT_S), and rank 0 logs it."""
    rank0 = _rank(0, port, {"MINIDIST_TIMEOUT_S": "60"})
    try:
        _wait_for_ports(rank0.pid, 2)
        with socket.create_connection(("127.0.0.1", port), timeout=20) as thief:
            _handshake(thief, b"")
            msg = json.dumps({"rank": 1, "world_size": 2, "host": "127.0.0.1",
                              "port": 1}).encode()
            thief.sendall(struct.pack("<I", len(msg)) + msg)
            assert thief.recv(1)  # the address table: the stranger holds rank 1's slot
            started = time.monotonic()
            (code1, _, err1), = _finish([_rank(1, port, {"MINIDIST_TIMEOUT_S": "60"})], 40)
            assert code1 != 0 and time.monotonic() - started < 40, err1
            where = "127.0.0.1:%d" % thief.getsockname()[1]
            assert f"rank 1 of this job already registered from {where}" in err1, err1
            assert "MINIDIST_AUTH_TOKEN" in err1, err1
    finally:
        os.killpg(rank0.pid, 9)
    _, err0 = rank0.communicate()
    assert f"already registered from {where}" in err0, err0


def test_the_handshake_limit_covers_the_whole_handshake(port):
    """A client that drips its handshake a byte at a time (each read well within the limit) is
    dropped once MINIDIST_TCP_HANDSHAKE_S has passed in all, before it has sent it all."""
    rank0 = _rank(0, port, {"MINIDIST_TCP_HANDSHAKE_S": "2"})
    sent = 0
    try:
        _wait_for_ports(rank0.pid, 2)
        with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
            for byte in tcp.MAGIC + os.urandom(tcp.NONCE_BYTES):  # 24 bytes, 12 s at this pace
                try:
                    s.sendall(bytes([byte]))
                except OSError:
                    break
                sent += 1
                time.sleep(0.5)
    finally:
        os.killpg(rank0.pid, 9)
    _, err0 = rank0.communicate()
    assert sent < len(tcp.MAGIC) + tcp.NONCE_BYTES, err0
    assert "did not complete the handshake within 2s" in err0, err0


def test_a_timeout_names_the_configured_seconds(port):
    """MINIDIST_TIMEOUT_S=5.5 (above the 5 s the ranks then give each other to report): the
    timed-out rank says its peer did not answer within 5.5 s, the deadline it was given."""
    script = REPO / "tests" / "watch" / "mismatch_cases.py"
    procs = []
    for r in range(2):
        env = job_env({"MINIDIST_TIMEOUT_S": "5.5"})
        env.update(RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, str(script), "--tcp", "slow"],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      env=env, cwd=str(REPO), start_new_session=True))
    try:
        out0, err0 = procs[0].communicate(timeout=60)
    finally:
        for p in procs:
            kill_group(p.pid, leader_alive=p.poll() is None)
            p.communicate()
    assert "CASE slow rank 0 CommTimeout" in out0, out0 + err0
    assert "rank 1 did not answer within 5.5 s" in out0, out0
