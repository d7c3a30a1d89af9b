"""The launcher's output as a user sees it: one ``[rank r]`` prefix per line (minidist's own
``[rank r/N]`` lines are not prefixed twice), and a progress bar (redrawn after ``\\r``) shown as
it advances, not whole at the end. Real launcher processes, bounded and killed (procs.py)."""

import os
import select
import subprocess
import sys
import time

from procs import REPO, job_env, kill_group, run_python

BAR = """\
import sys, time
from minidist.logger import get_logger
get_logger("demo").warning("hello from the logger")
print("plain line", flush=True)
for i in range(1, 4):
    sys.stderr.write(f"\\rbar {i}/3")
    sys.stderr.flush()
    time.sleep(0.1)
time.sleep(120 if sys.argv[1:] == ["hold"] else 0)   # the bar's line is never ended
sys.stderr.write("\\n")
"""


def test_lines_carry_one_rank_prefix(tmp_path):
    script = tmp_path / "bar.py"
    script.write_text(BAR)
    job = run_python(["-m", "minidist.launch", "--standalone", "--nproc-per-node", "2", script],
                     timeout_s=60)
    assert job.returncode == 0, job.report()
    for r in (0, 1):
        assert f"[rank {r}] plain line" in job.stdout, job.report()
        assert f"[rank {r}/2] WARNING minidist.demo: hello from the logger" in job.stderr
        assert f"[rank {r}] [rank {r}/2]" not in job.stderr, job.report()
        assert f"[rank {r}] bar 3/3" in job.stderr, job.report()
    assert "\n\n" not in job.stdout, job.report()  # a bar open on stderr: no extra line here


def test_a_progress_bar_shows_before_its_line_ends(tmp_path):
    script = tmp_path / "bar.py"
    script.write_text(BAR)
    p = subprocess.Popen([sys.executable, "-m", "minidist.launch", "--standalone",
                          "--nproc-per-node", "1", str(script), "hold"], cwd=REPO,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=job_env(),
                         start_new_session=True)
    seen, deadline = b"", time.monotonic() + 60
    try:
        while b"[rank 0] bar 3/3" not in seen and time.monotonic() < deadline:
            if select.select([p.stderr], [], [], 1.0)[0]:
                chunk = os.read(p.stderr.fileno(), 65536)
                if not chunk:
                    break
                seen += chunk
        assert p.poll() is None, seen  # still running: the bar's line never ended
        assert b"\r[rank 0] bar 1/3\r[rank 0] bar 2/3\r[rank 0] bar 3/3" in seen, seen
    finally:
        kill_group(p.pid)
        p.wait(timeout=10)
        p.stderr.close()
