"""``python -m minidist.launch``: torchrun's variables, prefixed output, one failure ends all.

Each test starts the launcher in a session of its own with a bounded wait, and SIGKILLs that
session (and every rank's) if anything is left, so no test can leave a process behind.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from procs import REPO, job_env

BODY = REPO / "tests" / "launch" / "launch_rank.py"
TRAIN = REPO / "examples" / "train.py"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def _launch(args: list, env: dict | None = None) -> subprocess.Popen:
    argv = [sys.executable, "-m", "minidist.launch", *map(str, args)]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=job_env({"MINIDIST_TIMEOUT_S": "30", **(env or {})}),
                            cwd=str(REPO), start_new_session=True)


def _finish(job: subprocess.Popen, timeout_s: float = 90) -> tuple[str, str]:
    try:
        return job.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        out, err = job.communicate()
        raise AssertionError(f"launcher timed out:\n{out[-2000:]}\n{err[-2000:]}") from None


def _gone(pids: list[int], timeout_s: float = 10) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(map(_alive, pids)):
        time.sleep(0.05)
    left = [p for p in pids if _alive(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    return left


def test_ranks_get_torchrun_env_and_prefixed_output():
    job = _launch(["--standalone", "--nproc_per_node", "2", BODY, "env"])
    out, err = _finish(job)
    assert job.returncode == 0, out + err
    for r in range(2):
        line = re.search(rf"^\[rank {r}\] ENV (.*)$", out, flags=re.M)
        assert line, out
        env = dict(kv.split("=", 1) for kv in line.group(1).split())
        assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"]) == (str(r), str(r), "2")
        assert env["LOCAL_WORLD_SIZE"] == "2" and env["MASTER_ADDR"] == "127.0.0.1"
        assert all(env[k] == "1" for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                           "NUMBA_NUM_THREADS", "OPENBLAS_NUM_THREADS"))
        assert f"[rank {r}] SUM 1" in out, out


def test_each_job_gets_its_own_secret_and_run_id():
    """On one node the launcher gives its ranks a MINIDIST_AUTH_TOKEN and a MINIDIST_RUN_ID of
    their own (none in the environment here), a new run id per job, the same for all ranks;
    and no rank 0 warning about a job without identity."""
    run_ids = []
    for _ in range(2):
        job = _launch(["--standalone", "--nproc-per-node", "2", BODY, "env"],
                      env={"MINIDIST_AUTH_TOKEN": "", "MINIDIST_RUN_ID": ""})
        out, err = _finish(job)
        assert job.returncode == 0, out + err
        envs = [dict(kv.split("=", 1) for kv in line.split()) for line in
                re.findall(r"^\[rank \d\] ENV (.*)$", out, flags=re.M)]
        assert len(envs) == 2 and all(e["TOKEN"] == "set" for e in envs), out
        assert envs[0]["RUN_ID"] == envs[1]["RUN_ID"] != "None", out
        assert "no identity" not in err, err
        run_ids.append(envs[0]["RUN_ID"])
    assert run_ids[0] != run_ids[1]
    job = _launch(["--standalone", "--rdzv-id", "digits-7", BODY, "env"])
    out, _ = _finish(job)
    assert "RUN_ID=digits-7" in out, out


def test_a_stranger_cannot_take_a_launched_rank_s_slot(port, tmp_path):
    """While rank 0 of a launched job waits alone, a process without the job's secret registers
    as rank 1: it is dropped (it never gets the address table) and the real rank 1 joins."""
    import json
    import socket
    import struct

    from minidist.tcp import rendezvous as tcp

    go = tmp_path / "go"
    job = _launch(["--nproc-per-node", "2", "--master-port", port, BODY, "late"],
                  env={"GO_FILE": str(go), "MINIDIST_AUTH_TOKEN": "", "MINIDIST_TIMEOUT_S": "20"})
    try:
        deadline, s = time.monotonic() + 30, None
        while s is None and time.monotonic() < deadline:
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=10)
            except OSError:
                time.sleep(0.1)
        assert s is not None, "rank 0 never listened"
        with s:
            nonce_c = os.urandom(tcp.NONCE_BYTES)
            s.sendall(tcp.MAGIC + nonce_c)
            reply = s.recv(len(tcp.MAGIC) + tcp.NONCE_BYTES + tcp.MAC_BYTES, socket.MSG_WAITALL)
            nonce_s = reply[len(tcp.MAGIC):len(tcp.MAGIC) + tcp.NONCE_BYTES]
            msg = json.dumps({"rank": 1, "world_size": 2, "host": "127.0.0.1", "port": 1})
            try:
                s.sendall(tcp.handshake_mac(b"", b"client", nonce_s, nonce_c)
                          + struct.pack("<I", len(msg)) + msg.encode())
                table = s.recv(4096)
            except OSError:
                table = b""
        go.touch()
        out, err = _finish(job, timeout_s=60)
    finally:
        go.touch()
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert table == b"", table  # dropped, not handed the job's addresses
    assert job.returncode == 0 and "[rank 1] SUM 1" in out, out + err
    assert "failed authentication" in err, err


def test_several_nodes_without_a_token_say_so_in_one_line(tmp_path):
    """Across nodes the launcher cannot make up a shared secret: it sets none, and says once
    how to share one."""
    from minidist.launch import parse_args, rank_env

    script = tmp_path / "nothing.py"
    script.write_text("pass\n")
    flags = ["--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "1", str(script)]
    env = rank_env(parse_args(flags), 0, base={})
    assert "MINIDIST_AUTH_TOKEN" not in env and "MINIDIST_RUN_ID" not in env
    job = _launch(flags, env={"MINIDIST_AUTH_TOKEN": "", "MINIDIST_RUN_ID": ""})
    out, err = _finish(job, timeout_s=30)
    notice = [line for line in err.splitlines() if "no MINIDIST_AUTH_TOKEN" in line]
    assert job.returncode == 0 and len(notice) == 1 and "--rdzv-id" in notice[0], err


def test_train_example_runs_under_the_launcher():
    job = _launch(["--nproc-per-node", "2", "--standalone", TRAIN, "--epochs", "2"])
    out, err = _finish(job, timeout_s=150)
    assert job.returncode == 0, out[-2000:] + err[-2000:]
    acc = re.findall(r"^\[rank 0\] final test_acc ([0-9.]+)", out, flags=re.M)
    assert acc and float(acc[-1]) >= 0.8, out[-2000:]


def test_a_failing_rank_ends_the_job_with_its_code():
    job = _launch(["--standalone", "--nproc-per-node", "2", BODY, "fail"])
    out, err = _finish(job)
    assert job.returncode == 3, out + err
    assert "rank 1 exited with code 3" in err, err
    assert "rank one gives up now" in err.split("rank 1 exited", 1)[1], err
    pids = [int(p) for p in re.findall(r"READY (\d+)", out)]
    assert pids and not _gone(pids), f"ranks left alive: {pids}"


def test_a_rank_that_printed_nothing_is_named_as_such(tmp_path):
    script = tmp_path / "silent.py"
    script.write_text("import os, sys, time\n"
                      "sys.exit(5) if os.environ['RANK'] == '1' else time.sleep(30)\n")
    job = _launch(["--standalone", "--nproc-per-node", "2", script])
    out, err = _finish(job)
    assert job.returncode == 5, out + err
    assert "rank 1 exited with code 5; stopped the other ranks. Rank 1 printed nothing." in err
    assert "''" not in err, err


def test_sigint_to_the_launcher_ends_every_rank_with_130():
    job = _launch(["--standalone", "--nproc-per-node", "2", BODY, "wait"])
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while len(pids) < 2 and time.monotonic() < deadline and job.poll() is None:
            m = re.search(r"READY (\d+)", job.stdout.readline())
            if m:
                pids.append(int(m.group(1)))
        assert len(pids) == 2, f"ranks did not start: {job.poll()}"
        job.send_signal(signal.SIGINT)
        out, err = _finish(job, timeout_s=30)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert job.returncode == 130, out + err
    assert "received SIGINT" in err, err
    assert not _gone(pids), f"ranks left alive: {pids}"


def test_bad_flags_are_refused_before_any_rank_starts():
    job = _launch(["--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "2", BODY, "env"])
    out, err = _finish(job, timeout_s=30)
    assert job.returncode == 2 and "--node-rank=2 must be in [0, 2)" in err, err


@pytest.mark.parametrize("flag", ["--nproc-per-node", "--nproc_per_node"])
def test_help_names_both_spellings(flag):
    job = _launch(["--help"])
    out, _ = _finish(job, timeout_s=30)
    assert job.returncode == 0 and flag in out, out


def test_ranks_die_with_a_killed_launcher():
    job = _launch(["--standalone", "--nproc-per-node", "2", BODY, "wait"])
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while len(pids) < 2 and time.monotonic() < deadline and job.poll() is None:
            m = re.search(r"READY (\d+)", job.stdout.readline())
            if m:
                pids.append(int(m.group(1)))
        assert len(pids) == 2, f"ranks did not start: {job.poll()}"
        job.kill()  # SIGKILL: the launcher cannot clean up; the ranks must still end
        job.communicate(timeout=30)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert not _gone(pids), f"ranks outlived the launcher: {pids}"


def test_slurm_job_script_is_valid_bash():
    """examples/slurm_job.sh cannot run without SLURM; at least its syntax is checked."""
    result = subprocess.run(["bash", "-n", str(REPO / "examples" / "slurm_job.sh")],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr


def test_standalone_port_stays_reserved_until_rank_0_binds_it():
    """--standalone keeps its free port bound: an ordinary bind fails (no other program can
    take the port before rank 0 binds), rank 0's rendezvous listener (SO_REUSEADDR) succeeds."""
    import errno
    import socket

    from minidist.launch import parse_args

    args = parse_args(["--standalone", "--nproc-per-node", "2", str(BODY), "env"])
    try:
        with socket.socket() as other:
            with pytest.raises(OSError) as e:
                other.bind(("127.0.0.1", args.master_port))
            assert e.value.errno == errno.EADDRINUSE
        with socket.socket() as rank0:
            rank0.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            rank0.bind(("127.0.0.1", args.master_port))
            rank0.listen()
    finally:
        args.reservation.close()
