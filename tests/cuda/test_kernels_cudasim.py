"""The CUDA kernels in Numba's CUDA simulator: cudasim_rank.py in a process of its own.

NUMBA_ENABLE_CUDASIM is read when numba is imported, and this pytest process has imported the
real numba already, so the simulator needs a fresh interpreter.
"""

import subprocess
import sys

from procs import REPO, job_env


def test_cuda_kernels_in_the_simulator():
    body = REPO / "tests" / "cuda" / "cudasim_rank.py"
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error", str(body)],
        env=job_env({"NUMBA_ENABLE_CUDASIM": "1"}), cwd=REPO, capture_output=True, text=True,
        timeout=180)
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-3000:]
    assert " passed" in res.stdout and "failed" not in res.stdout
