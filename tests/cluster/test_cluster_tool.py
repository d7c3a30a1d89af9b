"""The cluster tool itself: one line saying why where it cannot run, teardown on Ctrl-C, and
the namespaces of a killed run removed by the next one."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
from procs import REPO, job_env

from minidist.testing.cluster import cleanup_stale, netns_pids, unavailable_reason

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(60)]
ROOT_REASON = unavailable_reason()
needs_cluster = pytest.mark.skipif(ROOT_REASON is not None,
                                   reason=f"minidist.testing.cluster {ROOT_REASON}")


def namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.split()}


@pytest.mark.skipif(ROOT_REASON is not None or shutil.which("unshare") is None,
                    reason="needs root and unshare to drop root in a user namespace")
def test_without_root_one_line_says_why_and_the_tests_skip():
    drop = ["unshare", "--user"]  # uid 65534 inside: no CAP_NET_ADMIN
    res = subprocess.run([*drop, sys.executable, "-m", "minidist.testing.cluster", "--check"],
                         capture_output=True, text=True, timeout=30, env=job_env(), cwd=REPO)
    assert res.returncode == 1 and res.stdout == "", res
    assert res.stderr.count("\n") == 1 and "needs root" in res.stderr, res.stderr
    res = subprocess.run([*drop, sys.executable, "-m", "pytest", "tests/cluster/test_cluster.py",
                          "-q", "-rs", "-p", "no:cacheprovider"], capture_output=True,
                         text=True, timeout=60, env=job_env(), cwd=REPO)
    # exit 5: nothing but the skipped module was collected (the whole suite exits 0)
    assert res.returncode in (0, 5) and "1 skipped" in res.stdout, res.stdout + res.stderr
    assert "cluster tests: minidist.testing.cluster needs root" in res.stdout, res.stdout


@needs_cluster
def test_ctrl_c_tears_everything_down():
    cmd = [sys.executable, "-m", "minidist.testing.cluster", "--nodes", "2", "--each", "--",
           "sh", "-c", "echo ready; sleep 60"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=job_env(), cwd=REPO, start_new_session=True)
    try:
        seen, tag = [], None
        deadline = time.monotonic() + 30
        while sum("ready" in x for x in seen) < 2 and time.monotonic() < deadline:
            line = p.stdout.readline()
            seen.append(line)
        assert sum("ready" in x for x in seen) == 2, seen
        made = namespaces()
        os.killpg(p.pid, signal.SIGINT)
        out, err = p.communicate(timeout=20)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 130, (out, err)
    tag = re.search(r"\((mdc[0-9a-f]{8})n0\)", err).group(1)
    assert {f"{tag}n0", f"{tag}n1"} <= made
    assert not {ns for ns in namespaces() if ns.startswith(tag)}, namespaces()
    assert tag not in subprocess.run(["ip", "-o", "link"], capture_output=True,
                                     text=True).stdout
    assert not os.path.exists(f"/etc/netns/{tag}n0")


@needs_cluster
def test_namespaces_of_a_killed_run_are_removed_by_the_next():
    code = ("import sys, time\nfrom minidist.testing.cluster import Cluster\n"
            "c = Cluster(nodes=2); c.up(); c.start(1, ['sleep', '60'])\n"
            "print(c.tag, flush=True); time.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                         env=job_env(), cwd=REPO, start_new_session=True)
    try:
        tag = p.stdout.readline().strip()
        assert tag.startswith("mdc"), tag
    finally:
        os.killpg(p.pid, signal.SIGKILL)  # no teardown: namespaces and a sleep stay behind
        p.wait()
    assert {f"{tag}n0", f"{tag}n1"} <= namespaces()
    assert netns_pids(f"{tag}n1")  # the orphaned sleep
    removed = cleanup_stale()
    assert f"netns {tag}n1" in removed and f"link {tag}b" in removed, removed
    assert not {ns for ns in namespaces() if ns.startswith(tag)}
