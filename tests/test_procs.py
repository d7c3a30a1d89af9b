"""The test harness itself (tests/procs.py): no process outlives its test, whatever the job does.

Each case starts a job whose grandchild would live for minutes and prints its pid; after the
harness returns (or raises), that pid must be gone (checked with ``ps``). The cases carry a
pytest timeout far below the grandchild's life, so a harness that waited for it fails.
"""

from __future__ import annotations

import re
import subprocess
import textwrap
import time

import pytest

from procs import run_python

pytestmark = pytest.mark.timeout(60)

GRANDCHILD_S = 240


def _script(tmp_path, body: str) -> str:
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(body).replace("LIFE", str(GRANDCHILD_S)))
    return str(path)


def _alive_per_ps(pid: int) -> bool:
    out = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True,
                         text=True).stdout.strip()
    return out != "" and not out.startswith("Z")


def _assert_gone(pid: int) -> None:
    for _ in range(50):
        if not _alive_per_ps(pid):
            return
        time.sleep(0.1)
    raise AssertionError(f"process {pid} outlived its test")


def test_a_grandchild_holding_the_pipes_is_killed_at_the_deadline(tmp_path):
    """The leader exits at once; its child keeps stdout open and sleeps: the job times out at
    its one deadline and the grandchild is killed, though the leader is already gone."""
    script = _script(tmp_path, """
        import subprocess, sys
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(LIFE)"])
        print("GRANDCHILD", child.pid, flush=True)
    """)
    with pytest.raises(AssertionError, match="timed out after 3s") as info:
        run_python([script], timeout_s=3)
    assert "kept its output open" in str(info.value)
    _assert_gone(int(re.search(r"GRANDCHILD (\d+)", str(info.value)).group(1)))


def test_a_detached_grandchild_is_killed_after_a_successful_job(tmp_path):
    """The child closes its pipes, so the job ends well; the harness still ends it."""
    script = _script(tmp_path, """
        import subprocess, sys
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(LIFE)"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        print("GRANDCHILD", child.pid, flush=True)
    """)
    result = run_python([script], timeout_s=30)
    assert result.returncode == 0, result.report()
    _assert_gone(int(re.search(r"GRANDCHILD (\d+)", result.stdout).group(1)))


def test_a_grandchild_in_a_session_of_its_own_is_killed_on_timeout(tmp_path):
    """As Hydra starts ranks: the grandchild calls setsid, so killing the job's process group
    misses it; the harness follows the process tree as well."""
    script = _script(tmp_path, """
        import os, subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(LIFE)"],
                                 start_new_session=True)
        print("GRANDCHILD", child.pid, flush=True)
        time.sleep(LIFE)
    """)
    with pytest.raises(AssertionError, match="timed out after 3s") as info:
        run_python([script], timeout_s=3)
    _assert_gone(int(re.search(r"GRANDCHILD (\d+)", str(info.value)).group(1)))
