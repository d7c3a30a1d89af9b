"""A real SLURM on 2 namespace nodes (minidist.testing.slurm): the documented jobs and what a
SLURM user meets.

One SLURM (munged, slurmctld, a slurmd per node) serves every test of the module: both paths
of ``examples/slurm_job.sh`` train the main job to >= 0.97 across the two nodes, ``scancel``
ends every rank on both nodes, a node whose link is cut ends the job naming the peer, SLURM
refuses more nodes than exist before anything starts, ``srun --ntasks-per-node=2`` gives the
right local ranks, and start-up and teardown leave nothing behind. Needs root (CI runs as
root): the packages ``slurm-wlm`` and ``munge`` are installed with apt-get when missing;
elsewhere the module skips with one line saying why. Select with ``./test.sh -m cluster``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procs import REPO, job_env

from minidist.testing.cluster import (
    NETNS_ETC,
    Cluster,
    cleanup_stale,
    netns_pids,
    unavailable_reason,
)
from minidist.testing.slurm import SlurmCluster, install

REASON = unavailable_reason()
if REASON is None:
    REASON = install()  # root: apt-get install slurm-wlm munge when a program is missing
if REASON is not None:
    pytest.skip(f"SLURM tests: minidist.testing.slurm {REASON}", allow_module_level=True)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

JOB = "examples/slurm_job.sh"
TIMEOUT_S = 5  # MINIDIST_TIMEOUT_S of the lost-node job
FINAL = re.compile(r"^final test_acc (\d\.\d+)", re.M)
DOC = REPO / "docs" / "launching.md"
# A number of a quoted line: digits not glued to a lower-case word (node0, pmi2, x4 are words)
NUMBER = r"(?<![a-z_\d])\d[\d,]*(?:\.\d+)?"
ACCURACY = re.compile(r"(?:^|\s)(?:acc|val_acc|test_acc) $")
ACC_TOL = 0.01  # docs/launching.md states it


def quoted(name: str) -> list[str]:
    """The output lines docs/launching.md quotes under ``<!-- checked: ... (NAME) -->``: not
    the ``$ command`` lines, not ``...``."""
    m = re.search(rf"<!-- checked: tests/cluster/test_slurm.py \({name}\) -->\n```\w*\n(.*?)```",
                  DOC.read_text(), re.S)
    assert m, f"docs/launching.md quotes no '{name}' output"
    lines, command = [], False
    for x in m.group(1).splitlines():
        if x.startswith("$ ") or command:  # a command, with its continuation lines
            command = x.endswith("\\")
        elif x.strip() not in ("", "..."):
            lines.append(x)
    return lines


def line_matches(doc: str, real: str) -> bool:
    """The same words; accuracies within ACC_TOL; other numbers (job ids, ports, times, losses,
    rates, dates) free. A quoted line ending in `` ...`` is a prefix."""
    prefix = doc.endswith(" ...")
    d = re.split(f"({NUMBER})", doc[:-4] if prefix else doc)
    r = re.split(f"({NUMBER})", real)
    if prefix:
        r = r[:len(d)]
    if len(d) != len(r):
        return False
    for i, (a, b) in enumerate(zip(d, r)):
        if i % 2 == 0:
            if not (a == b or (prefix and i == len(d) - 1 and b.startswith(a))):
                return False
        elif ACCURACY.search(d[i - 1]) and abs(float(a) - float(b)) > ACC_TOL:
            return False
    return True


def check_quoted(name: str, real: str) -> None:
    """Every line docs/launching.md quotes for NAME is a line of this run's output."""
    lines = [x.rstrip() for x in real.splitlines()]
    missing = [q for q in quoted(name) if not any(line_matches(q.rstrip(), x) for x in lines)]
    assert not missing, (f"docs/launching.md quotes lines this run did not print ({name}): "
                         f"{missing}\n--- this run ---\n{real[-4000:]}")


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """Two nodes with SLURM idle on them, for the whole module; torn down at its end."""
    with Cluster(nodes=2) as c, SlurmCluster(c) as s:
        s.out = tmp_path_factory.mktemp("slurm-out")
        s.out.chmod(0o755)
        yield s


@pytest.fixture(autouse=True)
def no_job_outlives_its_test(request):
    """A test that fails mid-job must not leave the job holding the nodes of the next ones."""
    yield
    if "slurm" in request.fixturenames:
        s = request.getfixturevalue("slurm")
        s.client(["scancel", "--user=root"], check=False)


def env(**extra: str) -> dict:
    """What sbatch exports to the job (one BLAS thread per rank); s.env adds SLURM_CONF."""
    return job_env({"MINIDIST_LOG_LEVEL": "WARNING", **extra})


def submit(s: SlurmCluster, *args: str, **extra: str) -> int:
    e = s.env(env(**extra))
    return s.sbatch([f"--output={s.out}/%j.out", *args], env=e, cwd=str(REPO))


def ranks(s: SlurmCluster) -> dict[int, list[int]]:
    """The processes of examples/train.py still running, per node."""
    found: dict[int, list[int]] = {}
    for n in s.c.nodes:
        for pid in s.c.pids(n.index):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"examples/train.py" in cmd:
                found.setdefault(n.index, []).append(pid)
    return found


def wait_for(s: SlurmCluster, job: int, text: str, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in s.output(job):
        state = s.job(job).get("JobState")
        assert state in ("PENDING", "RUNNING"), f"job {job} {state}:\n{s.output(job)}"
        assert time.monotonic() < deadline, f"no {text!r} after {timeout_s} s:\n{s.output(job)}"
        time.sleep(0.2)


def show_job(s: SlurmCluster, job: int) -> str:
    return s.client(["scontrol", "show", "job", str(job)]).stdout


def final_output(s: SlurmCluster, job: int, text: str, timeout_s: float = 30) -> str:
    """The output of an ended job once ``text`` is in it: the batch step writes SLURM's last
    line (``*** JOB n ... CANCELLED ...``) a moment after the state changed."""
    deadline = time.monotonic() + timeout_s
    while text not in (out := s.output(job)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return out


def check_trained(s: SlurmCluster, job: int, transport: str) -> str:
    state = s.wait_job(job, timeout_s=200)
    out, info = s.output(job), s.job(job)
    check_quoted(transport, out + show_job(s, job))
    assert state == "COMPLETED" and info["ExitCode"] == "0:0", f"{state} {info}\n{out}"
    assert info["NodeList"] == "node[0-1]" and info["NumNodes"] == "2", info
    assert f"4 tasks on 2 nodes (node[0-1]), transport {transport}" in out, out
    m = FINAL.search(out)
    assert m and float(m.group(1)) >= 0.97, out
    assert "world_size 4" in out, out
    return out


def test_sbatch_mpi_path_trains_across_the_nodes(slurm):
    job = submit(slurm, "--nodes=2", JOB)
    out = check_trained(slurm, job, "mpi")
    assert "no 'pmi2' PMI plugin" not in out, out  # srun served PMI itself
    print(out)


def test_sbatch_tcp_path_trains_across_the_nodes(slurm):
    job = submit(slurm, "--nodes=2", JOB, "tcp")
    out = check_trained(slurm, job, "tcp")
    assert re.search(r"rendezvous at node0:\d+", out), out
    assert "MINIDIST_RUN_ID unset" not in out, out
    print(out)


def test_more_nodes_than_exist_is_refused_by_slurm(slurm):
    res = slurm.client(["sbatch", "--nodes=3", JOB], check=False, env=slurm.env(env()),
                       cwd=str(REPO))
    # EnforcePartLimits=ALL: refused at submission (3 nodes x 2 tasks > the partition's CPUs)
    assert res.returncode != 0 and "Batch job submission failed" in res.stderr, res
    assert slurm.client(["squeue", "-h"]).stdout == "" and not ranks(slurm)
    check_quoted("refused", res.stderr)
    print(res.stderr)


def test_srun_without_the_pmi_plugin_falls_back_to_the_wheels_mpiexec(slurm):
    job = submit(slurm, "--nodes=2", JOB, "--epochs", "1", MINIDIST_SRUN_MPI="pmi9")
    assert slurm.wait_job(job, timeout_s=120) == "COMPLETED", slurm.output(job)
    out = slurm.output(job)
    assert "world_size 4" in out, out
    check_quoted("fallback", out)


@pytest.mark.parametrize("transport", ["mpi", "tcp"])
def test_srun_two_tasks_per_node_have_their_local_ranks(slurm, transport):
    body = [sys.executable, "tests/cluster/slurm_ranks.py"]
    if transport == "mpi":
        argv = ["srun", "--nodes=2", "--ntasks-per-node=2", "--mpi=pmi2", *body]
    else:
        argv = ["srun", "--nodes=2", "--ntasks-per-node=2", "--mpi=none", "bash", "-c",
                'RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS '
                'MASTER_ADDR=node0 MASTER_PORT=29400 exec "$@"', "-", *body]
    res = slurm.client(argv, check=False, env=slurm.env(env()), cwd=str(REPO), timeout_s=90)
    assert res.returncode == 0, res
    got = sorted((json.loads(x.split("RANK ", 1)[1]) for x in res.stdout.splitlines()
                  if x.startswith("RANK ")), key=lambda r: r["rank"])
    assert [(r["rank"], r["host"], r["local_rank"], r["topology_local_rank"]) for r in got] == \
        [(0, "node0", 0, 0), (1, "node0", 1, 1), (2, "node1", 0, 0), (3, "node1", 1, 1)], got
    assert all(r["nodes"] == [[0, 1], [2, 3]] and not r["virtual"] and r["hier_ok"] and
               r["backend"] == transport for r in got), got


def test_srun_without_pmi_is_refused_instead_of_training_copies(slurm):
    argv = ["srun", "--nodes=2", "--ntasks-per-node=1", "--mpi=none", sys.executable,
            "tests/cluster/slurm_ranks.py"]
    res = slurm.client(argv, check=False, env=slurm.env(env()), cwd=str(REPO), timeout_s=60)
    assert res.returncode != 0 and "RANK " not in res.stdout, res
    check_quoted("no pmi", res.stdout + res.stderr)


def test_scancel_ends_every_rank_on_both_nodes(slurm):
    job = submit(slurm, "--nodes=2", JOB, "tcp", "--epochs", "1000")
    wait_for(slurm, job, "epoch 2/1000")
    assert set(ranks(slurm)) == {0, 1}, ranks(slurm)
    t0 = time.monotonic()
    slurm.client(["scancel", str(job)])
    state = slurm.wait_job(job, timeout_s=30)
    final_output(slurm, job, "CANCELLED AT")
    while ranks(slurm) and time.monotonic() - t0 < 30:
        time.sleep(0.1)
    took = time.monotonic() - t0
    assert state == "CANCELLED" and not ranks(slurm), (state, ranks(slurm))
    assert took < 15, f"ranks ended {took:.1f} s after scancel"
    print(f"scancel: CANCELLED, no rank left after {took:.1f} s\n{slurm.output(job)[-1500:]}")
    check_quoted("scancel", slurm.output(job) + show_job(slurm, job))
    slurm.wait_idle(30)


def test_lost_node_ends_the_job_naming_the_peer(slurm):
    # --no-requeue: SLURM's default (JobRequeue=1) would queue the job again after NODE_FAIL
    job = submit(slurm, "--nodes=2", "--no-requeue", JOB, "tcp", "--epochs", "1000",
                 MINIDIST_TIMEOUT_S=str(TIMEOUT_S))
    wait_for(slurm, job, "epoch 2/1000")
    slurm.c.link(1, up=False)
    t0 = time.monotonic()
    try:
        state = slurm.wait_job(job, timeout_s=90)
        took = time.monotonic() - t0
    finally:
        slurm.c.link(1, up=True)
    out = final_output(slurm, job, "DUE TO NODE FAILURE")
    print(f"link cut: {state} after {took:.1f} s\n{out[-3000:]}")
    assert state == "NODE_FAIL", (state, out)
    # node0's ranks name the peers of node1 (minidist), SLURM names the node
    assert re.search(r"\[rank 0/4\] .*[Rr]anks? [23](, [23])? stopped answering", out), out
    assert "Node failure on node1" in out, out
    check_quoted("lost node", out + show_job(slurm, job))
    deadline = time.monotonic() + 30
    while ranks(slurm).get(0) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not ranks(slurm).get(0), ranks(slurm)
    slurm.wait_idle(90)  # ReturnToService=2: node1 is idle again once its link is back
    assert not ranks(slurm), ranks(slurm)


def test_time_limit_ends_the_job_and_the_next_resumes(slurm):
    """--time=1: SLURM ends the job at its limit (TIMEOUT, no rank left); the newest
    checkpoint is whole, and the same command, queued with --dependency=afterany, continues
    from it."""
    ckpt = slurm.out / "ckpt"
    args = ["tcp", "--epochs", "1000", "--checkpoint-dir", str(ckpt), "--checkpoint-every", "1",
            "--resume-if-present"]
    job = submit(slurm, "--nodes=2", "--time=1", JOB, *args)
    again = submit(slurm, "--nodes=2", f"--dependency=afterany:{job}", JOB, *args,
                   "--stop-after-epochs", "1")
    wait_for(slurm, job, "epoch 2/1000")
    first = [pid for pids in ranks(slurm).values() for pid in pids]
    state = slurm.wait_job(job, timeout_s=150)
    out = final_output(slurm, job, "DUE TO TIME LIMIT")
    assert state == "TIMEOUT" and "DUE TO TIME LIMIT" in out, (state, out[-3000:])
    deadline = time.monotonic() + 30
    while any(running(pid) for pid in first) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(first) >= 4 and not any(running(pid) for pid in first), first
    print(out[-1500:])
    check_quoted("time limit", out + show_job(slurm, job))
    assert "resume: no checkpoint" in out, out[:3000]
    done = max(int(m) for m in re.findall(r"^epoch (\d+)/1000", out, re.M))
    assert slurm.wait_job(again, timeout_s=120) == "COMPLETED", slurm.output(again)
    assert not ranks(slurm), ranks(slurm)
    out2 = slurm.output(again)
    m = re.search(r"resumed from \S+: epoch (\d+)", out2)
    assert m and done - 1 <= int(m.group(1)) <= done, (done, out2[:3000])
    assert re.search(rf"^epoch {int(m.group(1)) + 1}/1000 ", out2, re.M), out2
    print(f"time limit: TIMEOUT after epoch {done}; resumed at epoch {m.group(1)}")


def running(pid: int) -> bool:
    """Not ended: a zombie (ended, its parent init not yet reaping it) counts as ended."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def mounts_of(tag: str) -> list[str]:
    return [x for x in Path("/proc/self/mountinfo").read_text().splitlines() if tag in x]


def commands(c: Cluster, word: bytes) -> list[int]:
    """The processes of the nodes whose program's path ends in ``word``."""
    found = []
    for n in c.nodes:
        for pid in c.pids(n.index):
            try:
                if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].endswith(word):
                    found.append(pid)
            except OSError:
                pass
    return found


def test_start_and_teardown_leave_nothing_behind():
    """Its own SLURM with a job running, left by an exception: every daemon, job, namespace,
    mount, socket and file goes, each way within a minute."""
    with pytest.raises(RuntimeError, match="on purpose"):
        with Cluster(nodes=2) as c, SlurmCluster(c) as s:
            tag, run, conf = c.tag, s.run, s.conf
            assert s.node_states() == {"node0": "idle", "node1": "idle"}
            check_quoted("sinfo", s.client(["sinfo"]).stdout)
            daemons = [d.proc.pid for d in s.daemons]
            job = s.sbatch(["--nodes=2", "--output=/dev/null", "--wrap", "srun sleep 300"])
            s.wait_job(job, 30, states=("RUNNING",))  # its tasks run in sessions of their own
            deadline = time.monotonic() + 30
            while len(commands(c, b"/sleep")) < 2 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert len(commands(c, b"/sleep")) == 2, commands(c, b"/sleep")
            inside = {n.netns: netns_pids(n.netns) for n in c.nodes}
            assert (run / "munge.socket").exists() and all(inside.values()), inside
            t0 = time.monotonic()
            raise RuntimeError("on purpose")
    teardown = time.monotonic() - t0  # the daemons and the job, then the nodes
    assert s.startup_took_s < 60 and teardown < 60, (s.startup_took_s, teardown)
    print(f"SLURM start-up {s.startup_took_s:.1f} s, teardown {teardown:.1f} s")
    left = [pid for pids in inside.values() for pid in pids if running(pid)]
    assert not left and not any(running(p) for p in daemons), left
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert tag not in names and not mounts_of(tag), (names, mounts_of(tag))
    assert not run.exists() and not conf.exists() and not (NETNS_ETC / f"{tag}n0").exists()
    assert not c.tmp


def test_ctrl_c_of_the_tool_tears_slurm_down():
    cmd = [sys.executable, "-m", "minidist.testing.slurm", "--nodes", "2", "--",
           "sh", "-c", "sinfo -h -o '%D %t'; sleep 60"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=job_env(), cwd=REPO, start_new_session=True)
    try:
        line = p.stdout.readline()
        assert line.strip() == "2 idle", (line, p.stderr.read() if p.poll() else "")
        os.killpg(p.pid, signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == 130, (out, err)
    conf = re.search(r"SLURM_CONF=(\S+)", err).group(1)
    tag = re.search(r"/(mdc[0-9a-f]{8})-", conf).group(1)
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert tag not in names and not mounts_of(tag) and not Path(conf).parent.exists(), err


def test_daemons_of_a_killed_run_are_removed_by_the_next():
    """SIGKILL leaves no teardown: the next run's cleanup_stale kills the daemons left in the
    namespaces and removes the namespaces and the run's folder (munge's socket with it)."""
    code = ("import time\nfrom minidist.testing.cluster import Cluster\n"
            "from minidist.testing.slurm import SlurmCluster\n"
            "c = Cluster(nodes=2); c.up(); s = SlurmCluster(c); s.up()\n"
            "print(c.tag, s.run, flush=True); time.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                         env=job_env(), cwd=REPO, start_new_session=True)
    try:
        tag, run = p.stdout.readline().split()
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    daemons = netns_pids(f"{tag}n0") + netns_pids(f"{tag}n1")
    assert len(daemons) >= 4 and Path(run, "munge.socket").exists(), (daemons, run)
    removed = cleanup_stale()
    assert f"netns {tag}n1" in removed and str(Path(run).parent) in removed, removed
    assert not any(running(pid) for pid in daemons) and not Path(run).parent.exists()
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert tag not in names and not mounts_of(tag), names
